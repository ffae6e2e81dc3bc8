#!/usr/bin/env python3
"""Does the broker rebalance a consumer group when a member dies?

A minimal reproduction, with a Kafka client written by others (aiokafka) and
no denorm at all: two members of one group share a 4-partition topic; one is
SIGKILLed; Kafka's group coordinator evicts it when its session expires
(6 s here) and hands its partitions to the live member. A broker that starts
no rebalance then leaves them with nobody: the live member keeps its own
share for good.

    scripts/repro/dead-member.py HOST:PORT

Exits 0 when the live member got every partition within 30 s, 1 when it did
not (the broker's fault), 2 on a setup error. Uses the interop tools'
virtualenv (scripts/install-interop.sh) for aiokafka.
"""
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

SESSION_MS = 6000
WAIT_S = 30


async def member(brokers, topic, group):
    """One group member: prints its assignment whenever it changes."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=brokers, group_id=group, enable_auto_commit=False,
                         session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
    await c.start()
    last = None
    try:
        while True:
            await c.getmany(timeout_ms=200)
            now = sorted(tp.partition for tp in c.assignment())
            if now != last:
                print("assigned " + ",".join(map(str, now)), flush=True)
                last = now
    finally:
        await c.stop()


async def create_topic(brokers, topic):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=brokers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    finally:
        await admin.close()


class Member:
    def __init__(self, brokers, topic, group):
        self.p = subprocess.Popen([sys.executable, __file__, "--member", brokers, topic, group],
                                  stdout=subprocess.PIPE, text=True)
        os.set_blocking(self.p.stdout.fileno(), False)
        self.held = None

    def poll(self):
        for line in iter(self.p.stdout.readline, ""):
            if line.startswith("assigned "):
                self.held = {int(x) for x in line.split()[1].split(",") if x} if line.split()[1:] else set()
        return self.held


def until(seconds, check):
    end = time.time() + seconds
    while time.time() < end:
        if check():
            return True
        time.sleep(0.2)
    return False


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--member":
        asyncio.run(member(*sys.argv[2:]))
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    brokers = sys.argv[1]
    topic, group = "dead-member-" + uuid.uuid4().hex[:8], "g-" + uuid.uuid4().hex[:8]
    asyncio.run(create_topic(brokers, topic))
    live, doomed = Member(brokers, topic, group), Member(brokers, topic, group)
    try:
        if not until(60, lambda: live.poll() and doomed.poll() and len(live.held) + len(doomed.held) == 4):
            print(f"setup: the two members never shared the 4 partitions (live {live.held}, other {doomed.held})")
            return 2
        print(f"before: live member holds {sorted(live.held)}, the other {sorted(doomed.held)}; SIGKILL the other")
        doomed.p.send_signal(signal.SIGKILL)
        doomed.p.wait()
        t = time.time()
        if until(WAIT_S, lambda: live.poll() == {0, 1, 2, 3}):
            print(f"rebalanced: the live member holds all 4 partitions {time.time() - t:.1f} s after the kill (session timeout {SESSION_MS / 1000:.0f} s)")
            return 0
        print(f"NOT rebalanced: {WAIT_S} s after the kill (session timeout {SESSION_MS / 1000:.0f} s) the live member still holds only {sorted(live.held)}; the dead member's partitions have no consumer")
        return 1
    finally:
        for m in (live, doomed):
            if m.p.poll() is None:
                m.p.terminate()
                m.p.wait()


if __name__ == "__main__":
    sys.exit(main())
