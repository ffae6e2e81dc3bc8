//! The index decides where each partition resumes, and knows which log it
//! was built from (issue 10, items 2 and 3): tests on a real broker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use denorm::index::embedded::EmbeddedIndex;
use denorm::kafka::group_lag;

/// Waits until every partition's shard has applied its whole log (`ends`:
/// the end offset of each partition), whatever the group's offsets say.
fn wait_index_at(index: &std::path::Path, ends: &[(i32, i64)], worker: &Worker) {
    let at = || EmbeddedIndex::open_existing(index).unwrap().checkpoints().unwrap();
    eventually(
        Duration::from_secs(120),
        || format!("the index never caught up: {:?} of {ends:?}\n{}", at(), worker.log()),
        || {
            let at = at();
            ends.iter().all(|&(p, end)| end == 0 || at.get(&p).is_some_and(|c| c.offset as i64 >= end - 1)).then_some(())
        },
    );
}

#[test]
fn an_index_restored_from_an_older_copy_is_caught_up_and_the_group_offset_never_moves_back() {
    let r = Rig::new(3);
    let mut log = produce(&r.cfg, denorm::demo::seed(3000, 30, 300, 5));
    let w = r.worker(&[]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    let (status, text) = w.terminate_with_log();
    assert!(status.success(), "{text}");
    let copy = r.dir().join("copy");
    copy_dir(&r.index, &copy);

    // More commands, applied to the index that is then thrown away.
    let mut more = files_under("restored", "/projects", 20_000);
    more.extend(denorm::demo::user_renames(10, 7));
    log.extend(produce(&r.cfg, more));
    let w = r.worker(&[]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    let (status, text) = w.terminate_with_log();
    assert!(status.success(), "{text}");
    let lag = group_lag(&r.cfg, &r.group).unwrap();
    assert_eq!(lag.total, 0);
    let ends: Vec<(i32, i64)> = lag.partitions.iter().map(|p| (p.partition, p.end)).collect();

    // The older copy comes back; the group's offsets are at the end.
    std::fs::remove_dir_all(&r.index).unwrap();
    copy_dir(&copy, &r.index);
    let lowest: Arc<Mutex<Vec<i64>>> = Arc::new(Mutex::new(lag.partitions.iter().map(|p| p.committed).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = {
        let (cfg, group, lowest, stop, reads) = (r.cfg.clone(), r.group.clone(), lowest.clone(), stop.clone(), reads.clone());
        std::thread::spawn(move || {
            use rdkafka::consumer::{BaseConsumer, Consumer};
            let mut c = cfg.client_config();
            c.set("group.id", &group).set("enable.auto.commit", "false");
            let consumer: BaseConsumer = c.create().unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            for p in 0..cfg.partitions {
                tpl.add_partition(&cfg.topic, p);
            }
            while !stop.load(Ordering::SeqCst) {
                if let Ok(committed) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) {
                    let mut low = lowest.lock().unwrap();
                    for e in committed.elements() {
                        if let rdkafka::Offset::Offset(o) = e.offset() {
                            let i = e.partition() as usize;
                            low[i] = low[i].min(o);
                        }
                    }
                    reads.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let w = r.worker(&[]);
    wait_index_at(&r.index, &ends, &w);
    let (_, metrics) = w.http_get("/metrics");
    let applied = metric(&metrics, "denorm_commands_total", &[("outcome", "applied")]);
    assert!(applied >= 20_000.0, "the worker applied {applied} commands: it did not resume at the copy's checkpoints\n{metrics}");
    // Every commit the worker sent has landed once it exited (its last
    // ones at its stop): the watcher reads the group's offsets once more
    // after that.
    let (status, text) = w.terminate_with_log();
    assert!(status.success(), "{text}");
    let seen = reads.load(Ordering::SeqCst);
    eventually(Duration::from_secs(30), || "the watcher read the group's offsets no more".into(), || (reads.load(Ordering::SeqCst) > seen).then_some(()));
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let reads = reads.load(Ordering::SeqCst);
    assert!(reads > 10, "the watcher read the group's offsets only {reads} times");
    assert_matches_model(&r.index, &log);
    let ends_only: Vec<i64> = ends.iter().map(|&(_, e)| e).collect();
    assert_eq!(*lowest.lock().unwrap(), ends_only, "the group's committed offsets moved back while the index caught up");
}

#[test]
fn a_recreated_topic_is_refused_with_the_mismatch_and_the_fix_named() {
    // A broker of its own: tansu 0.6 deletes every topic of the cluster when
    // asked to delete one (its topic_delete_by.sql filters on the cluster).
    let mut r = Rig::on(Broker::private(), 2);
    // One key: every command in the same partition.
    let log = produce(&r.cfg, files_under("old", "/a", 200));
    let w = r.worker(&[]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    let (status, text) = w.terminate_with_log();
    assert!(status.success(), "{text}");
    let before = dump(&r.index);

    // A shorter log under the same name: the checkpoint's offset is past its end.
    recreate_topic(&mut r.cfg, 2);
    produce(&r.cfg, files_under("new", "/a", 10));
    let (status, text) = r.worker(&[]).wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "{text}");
    assert!(text.contains("checkpoint is offset 199") && text.contains("ends at offset 10, before it"), "{text}");
    assert!(text.contains("denorm rebuild"), "the fix is not named:\n{text}");
    assert_eq!(dump(&r.index), before, "commands of the new log were applied");

    // A longer one: another message at the checkpoint's offset.
    produce(&r.cfg, files_under("newer", "/a", 400));
    let (status, text) = r.worker(&[]).wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "{text}");
    assert!(text.contains("a different message is at that offset now"), "{text}");
    assert_eq!(dump(&r.index), before, "commands of the new log were applied");

    // Recreated with more partitions: refused before anything is consumed.
    recreate_topic(&mut r.cfg, 3);
    let (status, text) = r.worker(&[]).wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "{text}");
    assert!(text.contains("built from a topic of 2 partitions, the topic now has 3"), "{text}");
}
