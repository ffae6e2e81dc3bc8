//! Shared helpers of the integration tests: a real Kafka-protocol broker
//! (tansu), worker processes, produce/wait/dump helpers.
#![allow(dead_code)]

pub mod broker;
pub mod chaos;
pub mod cut;
pub mod elastic;
pub mod forensics;
pub mod ports;
pub mod read_ahead;
pub mod shop;
pub mod tls;

pub use broker::{broker, start_noida, Broker};

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use denorm::command::Command;
use denorm::command::LogPosition;
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::{Doc, SearchIndex};
use denorm::kafka::{self, KafkaConfig};
use denorm::model::{self, Model};
use denorm::produce::Producer;

/// A server process of this test's own, with its scratch directory;
/// killed when dropped.
pub struct Private {
    pub child: Child,
    pub dir: tempfile::TempDir,
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 50 ms until it gives a value, and returns it; after
/// `timeout`, fails the test with `what()` (called only then, so that it
/// can include the logs of that moment). The one deadline loop of the
/// tests: every wait for an observable condition goes through it.
pub fn eventually<T>(timeout: Duration, what: impl FnOnce() -> String, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {timeout:?}: {}", what());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A name no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// A fresh topic with `partitions` partitions on `broker`.
pub fn topic(broker: &Broker, partitions: i32) -> KafkaConfig {
    let mut cfg = KafkaConfig::new(broker.brokers.clone(), unique("denorm-test"));
    cfg.partitions = partitions;
    rt().block_on(cfg.ensure_topic()).expect("create topic");
    cfg
}

/// One test's broker, topic (of its own), consumer group, index directory,
/// and fault switches for its workers (`DENORM_FAULTS`, see src/faults.rs).
pub struct Rig {
    pub broker: Broker,
    pub cfg: KafkaConfig,
    pub group: String,
    /// The `--index` of the workers: a directory, or an Elasticsearch URL
    /// (see [`Rig::elastic`]).
    pub index: PathBuf,
    faults: PathBuf,
    dir: tempfile::TempDir,
    _es: Option<elastic::Elastic>,
}

impl Rig {
    /// On the test's broker (`broker()`).
    pub fn new(partitions: i32) -> Rig {
        Rig::on(broker(), partitions)
    }

    pub fn on(broker: Broker, partitions: i32) -> Rig {
        let r = Rig::unwatched(broker, partitions);
        forensics::watch(&r.cfg, &r.group, &r.index);
        r
    }

    /// A rig on the embedded index, not yet watched by the failure report.
    fn unwatched(broker: Broker, partitions: i32) -> Rig {
        let cfg = topic(&broker, partitions);
        let dir = tempfile::tempdir().unwrap();
        let faults = dir.path().join("faults");
        std::fs::create_dir_all(&faults).unwrap();
        Rig { broker, cfg, group: unique("g"), index: dir.path().join("index"), faults, dir, _es: None }
    }

    /// On the test's broker, with the Elasticsearch-API server of the suite
    /// as the index (under this test's own prefix).
    pub fn elastic(partitions: i32) -> Rig {
        Rig::elastic_on(broker(), partitions)
    }

    /// [`Rig::elastic`] on `broker`.
    pub fn elastic_on(broker: Broker, partitions: i32) -> Rig {
        let es = elastic::elastic();
        let mut r = Rig::unwatched(broker, partitions);
        r.index = PathBuf::from(&es.url);
        r._es = Some(es);
        forensics::watch(&r.cfg, &r.group, &r.index);
        r
    }

    /// Whether the index is Elasticsearch.
    pub fn is_elastic(&self) -> bool {
        self._es.is_some()
    }

    /// A scratch directory of this test.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Switches fault point `name` on (with argument `arg`) for the workers.
    pub fn on_fault(&self, name: &str, arg: &str) {
        std::fs::write(self.faults.join(name), arg).unwrap();
    }

    /// The directory of this rig's fault switches (`DENORM_FAULTS`).
    pub fn faults_dir(&self) -> &Path {
        &self.faults
    }

    pub fn off_fault(&self, name: &str) {
        std::fs::remove_file(self.faults.join(name)).unwrap();
    }

    /// A `denorm run` of this rig's group on its index.
    pub fn worker(&self, extra: &[&str]) -> Worker {
        self.worker_of(&self.group, &self.index, extra)
    }

    /// A `denorm run` of another group on another index, with this rig's
    /// fault points (a replay).
    pub fn worker_of(&self, group: &str, index: &Path, extra: &[&str]) -> Worker {
        Worker::start_env(&self.cfg, group, index, extra, &[("DENORM_FAULTS", self.faults.as_os_str())])
    }

    /// `denorm <args>` with this rig's global options.
    pub fn run(&self, args: &[&str]) -> (i32, String, String) {
        output(cli(&self.cfg, &self.group, &self.index).args(args))
    }

    /// The command topic's end offsets, summed (messages and offsets
    /// without one, such as transaction markers).
    pub fn topic_end(&self) -> i64 {
        denorm::kafka::group_lag(&self.cfg, &self.group).unwrap().partitions.iter().map(|p| p.end).sum()
    }

    pub fn dlq_count(&self) -> serde_json::Value {
        let (code, out, err) = self.run(&["dlq", "count", "--json"]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    }
}

/// Produces `commands` in order; returns (delivery, command) pairs.
pub fn produce(cfg: &KafkaConfig, commands: Vec<Command>) -> Vec<(LogPosition, Command)> {
    rt().block_on(async {
        let p = Producer::new(cfg).unwrap();
        let d = p.send_all(commands.clone(), 5000, |_| {}).await.unwrap();
        d.into_iter().zip(commands).collect()
    })
}

/// Waits until `group` has applied every message (at least `min_end`).
pub fn wait_applied(cfg: &KafkaConfig, group: &str, min_end: usize) {
    kafka::wait_until_applied(cfg, group, min_end as i64, Duration::from_secs(180), |_| {}).expect("workers applied everything");
}

/// Waits until the group has applied `n` messages. tansu 0.6 (and noida-db's
/// broker) start no rebalance when a dead member's session expires
/// (scripts/repro/dead-member.py): its partitions stay with nobody until
/// the next join, and a worker holding others of the group's partitions
/// cannot tell them from a busy owner's. When the group makes no progress
/// for 15 s, a fresh worker (`start`) joins, as a redeploy would, at most 5
/// times. Returns the workers started so.
pub fn applied_with_nudges(cfg: &KafkaConfig, group: &str, n: usize, start: impl Fn() -> Worker) -> Vec<Worker> {
    let mut nudges = Vec::new();
    let mut last_committed = -1;
    loop {
        match kafka::wait_until_applied(cfg, group, n as i64, Duration::from_secs(15), |_| {}) {
            Ok(_) => return nudges,
            Err(kafka::WaitError::Timeout(Some(report))) => {
                let committed: i64 = report.partitions.iter().map(|p| p.committed).sum();
                if committed == last_committed {
                    assert!(nudges.len() < 5, "no progress even after {} fresh joins: {report:?}", nudges.len());
                    nudges.push(start());
                }
                last_committed = committed;
            }
            Err(e) => panic!("waiting for the group: {e}"),
        }
    }
}

/// [`wait_applied`] with `workers`' logs in the failure message.
pub fn wait_applied_by(cfg: &KafkaConfig, group: &str, min_end: usize, workers: &[&Worker]) {
    if let Err(e) = kafka::wait_until_applied(cfg, group, min_end as i64, Duration::from_secs(180), |_| {}) {
        let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
        panic!("workers applied everything: {e:?}\n{}", logs.join("\n----- next worker -----\n"));
    }
}

/// Deletes the topic and creates it again with `partitions` (the commands
/// in it are gone; offsets start over at 0). On tansu 0.6 this deletes every
/// other topic too: only on a private broker.
pub fn recreate_topic(cfg: &mut KafkaConfig, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    rt().block_on(async {
        let admin: AdminClient<DefaultClientContext> = cfg.client_config().create().unwrap();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in admin.delete_topics(&[&cfg.topic], &opts).await.unwrap() {
            r.unwrap_or_else(|(t, e)| panic!("deleting {t}: {e}"));
        }
        // Until the metadata no longer shows it.
        eventually(Duration::from_secs(30), || format!("topic {} still listed after its deletion", cfg.topic), || cfg.topic_partitions().unwrap().is_none().then_some(()));
        cfg.partitions = partitions;
        cfg.ensure_topic().await.expect("create the topic again");
    });
}

/// Copies directory `from` to `to` (which must not exist), recursively.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Every document of the index (a directory, or an Elasticsearch URL).
pub fn dump(index: &Path) -> Vec<Doc> {
    if elastic::is_url(index) {
        return elastic::dump(&index.to_string_lossy());
    }
    let mut out = Vec::new();
    EmbeddedIndex::open_existing(index).unwrap().search().unwrap().dump(&mut |d| out.push(d)).unwrap();
    out
}

/// [`dump`], for a condition polled while a worker starts: nothing while
/// the embedded index is not created yet (the worker creates it; a poll
/// that came first panicked, seen in CI).
pub fn dump_once_created(index: &Path) -> Vec<Doc> {
    if elastic::is_url(index) {
        return elastic::dump_once_created(&index.to_string_lossy());
    }
    if EmbeddedIndex::open_existing(index).is_err() {
        return Vec::new();
    }
    dump(index)
}

/// The reference model of a produced log, applied in partition order.
pub fn model_of(log: &[(LogPosition, Command)]) -> Model {
    let mut sorted: Vec<_> = log.iter().collect();
    sorted.sort_by_key(|(d, _)| (d.partition, d.offset));
    let mut m = Model::default();
    for (_, c) in sorted {
        m.apply(c);
    }
    m
}

/// Asserts that the index equals the model of `log` exactly.
pub fn assert_matches_model(index: &Path, log: &[(LogPosition, Command)]) {
    let commands: Vec<(LogPosition, &Command)> = log.iter().map(|(at, c)| (*at, c)).collect();
    assert_equals(&model_of(log), index, &commands);
}

/// Asserts that the index holds exactly the model's documents; a failure
/// names, for the first differing documents, the commands of `log` that
/// wrote their key (in the failure report, see [`forensics`]).
fn assert_equals(m: &Model, index: &Path, log: &[(LogPosition, &Command)]) {
    let diffs = model::diff(m.docs(), dump(index), 20);
    if !diffs.is_empty() {
        let mut text = String::new();
        for d in diffs.iter().take(3) {
            // "<kind> <id>: ..."
            let id = d.split(':').next().and_then(|h| h.split(' ').nth(1)).unwrap_or_default();
            text.push_str(&format!("  {d}\n    written by:{}\n", forensics::writers_of(id, log)));
        }
        forensics::differences(text);
    }
    assert!(diffs.is_empty(), "index differs from the model:\n{}{}", diffs.join("\n"), where_duplicated(index, &diffs));
}

/// For a difference that names a document held twice (embedded index):
/// the partitions whose shards hold such documents, so that a failure
/// says whether one shard holds two copies or two shards one each.
fn where_duplicated(index: &Path, diffs: &[String]) -> String {
    if elastic::is_url(index) || !diffs.iter().any(|d| d.ends_with(": duplicated")) {
        return String::new();
    }
    match EmbeddedIndex::open_existing(index).and_then(|i| i.held_by_several_partitions()) {
        Ok(held) if held.is_empty() => "\nno document is held by several partitions' shards: one shard holds both copies".into(),
        Ok(held) => format!("\n{} documents are held by several partitions' shards, first: {:?}", held.len(), &held[..held.len().min(5)]),
        Err(e) => format!("\n(could not read the shards: {e})"),
    }
}

/// A `denorm run` process with its stderr captured line by line.
pub struct Worker {
    child: Child,
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// The `denorm` binary of this build (`DENORM_TEST_BIN` names another: a
/// copy, for a long loop of tests while the tree is rebuilt).
pub fn denorm() -> Proc {
    Proc::new(std::env::var_os("DENORM_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_denorm").into()))
}

/// Runs a denorm command: (exit code, stdout, stderr).
pub fn output(cmd: &mut Proc) -> (i32, String, String) {
    let o = cmd.stdin(Stdio::null()).output().expect("run denorm");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

/// `denorm` with the global options of `cfg`, `group` and `index`.
pub fn cli(cfg: &KafkaConfig, group: &str, index: &Path) -> Proc {
    let mut c = denorm();
    c.args(["--brokers", &cfg.brokers, "--topic", &cfg.topic, "--group", group, "--partitions", &cfg.partitions.to_string()]);
    c.arg("--index").arg(index);
    c
}

pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

impl Worker {
    pub fn start(cfg: &KafkaConfig, group: &str, index: &Path, extra: &[&str]) -> Worker {
        Worker::start_env(cfg, group, index, extra, &[])
    }

    /// [`Worker::start`] with extra environment variables.
    pub fn start_env(cfg: &KafkaConfig, group: &str, index: &Path, extra: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Worker {
        let mut child = denorm()
            .envs(env.iter().copied())
            .args(["--brokers", &cfg.brokers, "--topic", &cfg.topic, "--group", group])
            .arg("--index")
            .arg(index)
            .args(["--partitions", &cfg.partitions.to_string(), "run"])
            // Port 0: the worker binds a free port itself and logs it (a
            // port picked here could be taken, by another test's
            // connection, before the worker binds it).
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(extra)
            .env("DENORM_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start denorm run");
        let stderr = child.stderr.take().unwrap();
        let pid = child.id();
        let lines: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
        forensics::watch_worker(cfg, group, index, extra, env);
        forensics::keep_log(pid, format!("denorm run {}", extra.join(" ")), lines.clone());
        let l = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var("DENORM_TEST_ECHO").is_ok() {
                    eprintln!("worker {pid}: {line}");
                }
                l.0.lock().unwrap().push(line);
                l.1.notify_all();
            }
        });
        Worker { child, lines, reader: Some(reader) }
    }

    /// Waits until a log line contains `needle`; true if it did in time.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.lines;
        let mut lines = lock.lock().unwrap();
        loop {
            if lines.iter().any(|l| l.contains(needle)) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            lines = cv.wait_timeout(lines, deadline - now).unwrap().0;
        }
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.lines.0.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    pub fn log(&self) -> String {
        self.lines.0.lock().unwrap().join("\n")
    }

    /// SIGKILL: no chance to drain or commit.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(self) -> ExitStatus {
        self.terminate_with_log().0
    }

    /// SIGTERM, waits for the exit, and returns the whole log.
    pub fn terminate_with_log(self) -> (ExitStatus, String) {
        self.sigterm();
        self.wait_exit(Duration::from_secs(60))
    }

    /// SIGTERM, without waiting.
    pub fn sigterm(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Waits (at most `timeout`) for the worker to exit by itself: its exit
    /// status and whole log.
    pub fn wait_exit(mut self, timeout: Duration) -> (ExitStatus, String) {
        let lines = self.lines.clone();
        let child = &mut self.child;
        let s = eventually(timeout, || format!("worker still running:\n{}", lines.0.lock().unwrap().join("\n")), || child.try_wait().unwrap());
        if let Some(r) = self.reader.take() {
            let _ = r.join(); // stderr reaches EOF once the process is gone
        }
        (s, self.log())
    }

    /// The value of metric `name` with `labels` on the worker's endpoint.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric(&self.http_get("/metrics").1, name, labels)
    }

    /// GET `path` on the worker's metrics endpoint: (status line, body).
    pub fn http_get(&self, path: &str) -> (String, String) {
        http_get(self.metrics_port(), path)
    }

    /// Waits until the worker, started on an index whose every one of
    /// `partitions` has a checkpoint and nothing after it, has read each
    /// checkpoint's own message again (to check the log) and skipped it as
    /// a duplicate; asserts that it applied nothing again.
    pub fn assert_resumed_at_checkpoints(&self, partitions: usize) {
        let duplicates = |m: &str| metric(m, "denorm_commands_total", &[("outcome", "duplicate")]);
        let want = partitions as f64;
        let metrics = eventually(
            Duration::from_secs(30),
            || format!("not {partitions} duplicates:\n{}", self.http_get("/metrics").1),
            || {
                let (_, m) = self.http_get("/metrics");
                (duplicates(&m) >= want).then_some(m)
            },
        );
        assert_eq!(duplicates(&metrics), want, "{metrics}");
        assert_eq!(metric(&metrics, "denorm_commands_total", &[("outcome", "applied")]), 0.0, "{metrics}");
    }

    /// The port the worker's metrics endpoint bound, from its log.
    pub fn metrics_port(&self) -> u16 {
        const SERVING: &str = "serving /metrics, /healthz, /readyz addr=127.0.0.1:";
        assert!(self.wait_for_log(SERVING, Duration::from_secs(60)), "the worker never served its metrics endpoint:\n{}", self.log());
        let lines = self.lines.0.lock().unwrap();
        let line = lines.iter().find(|l| l.contains(SERVING)).unwrap();
        let port = line.split(SERVING).nth(1).unwrap().split(|c: char| !c.is_ascii_digit()).next().unwrap();
        port.parse().unwrap_or_else(|e| panic!("{line}: {e}"))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = eventually(Duration::from_secs(30), || format!("cannot connect to port {port}"), || TcpStream::connect(("127.0.0.1", port)).ok());
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

/// Sum of a Prometheus sample family matching all `labels` in `text`.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn s(x: &str) -> String {
    x.to_string()
}

/// `n` files under `dir` (ids `{prefix}{i}`).
pub fn files_under(prefix: &str, dir: &str, n: usize) -> Vec<Command> {
    (0..n).map(|i| Command::UpsertFile { id: format!("{prefix}{i}"), path: format!("{dir}/d{}/file{i}.txt", i % 50), contents: format!("contents {i} lorem ipsum"), previous_path: None }).collect()
}

/// The JSON report a command printed on stdout (`--json`), or a panic
/// naming its exit status, stdout and stderr.
pub fn report_of(code: i32, out: &str, err: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("exit {code}, {e}: {out:?}\n{err}"))
}

/// Sends raw `(key, payload)` messages in order, as a foreign producer would.
pub fn send_raw(cfg: &KafkaConfig, messages: &[(Option<&str>, Vec<u8>)]) {
    send_raw_placed(cfg, messages, false)
}

/// [`send_raw`]; with `murmur2`, each keyed message goes to its key's
/// partition as the Java client's partitioner places it (as denorm expects).
pub fn send_raw_placed(cfg: &KafkaConfig, messages: &[(Option<&str>, Vec<u8>)], murmur2: bool) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    rt().block_on(async {
        let p: FutureProducer = cfg.client_config().create().unwrap();
        for (key, m) in messages {
            let mut r = FutureRecord::<str, Vec<u8>>::to(&cfg.topic).payload(m);
            if let Some(k) = key {
                r = r.key(*k);
                if murmur2 {
                    r = r.partition(denorm::command::partitioner::partition_of(k, cfg.partitions));
                }
            }
            p.send(r, Duration::from_secs(30)).await.unwrap();
        }
    });
}

/// Polls the worker's `/readyz` until its status line contains `want`.
pub fn wait_ready_status(worker: &Worker, want: &str) -> String {
    eventually(
        Duration::from_secs(60),
        || format!("/readyz never answered {want} (last: {:?})\n{}", worker.http_get("/readyz"), worker.log()),
        || {
            let (status, body) = worker.http_get("/readyz");
            status.contains(want).then_some(body)
        },
    )
}

/// The reference model of everything in the topic, in the order the
/// system serialized it (see [`model::serialized`]; a message that does not
/// decode, a poison, changes nothing): (model, cross-key renames that moved
/// files, those in several messages).
pub fn model_of_topic(cfg: &KafkaConfig) -> (Model, usize, usize) {
    model_of_logs(&read_decodable(cfg))
}

/// [`model_of_topic`] of logs read already.
pub fn model_of_logs(logs: &[Vec<(i64, denorm::codec::Decoded)>]) -> (Model, usize, usize) {
    let (m, moves) = model::serialized(logs).unwrap();
    (m, moves.arrived, moves.chunked)
}

/// Every message of the topic that decodes, partition by partition.
pub fn read_decodable(cfg: &KafkaConfig) -> Vec<Vec<(i64, denorm::codec::Decoded)>> {
    kafka::read_topic_decodable(cfg, &denorm::codec::Codec::new()).unwrap().0
}

/// Asserts that the index equals [`model_of_topic`]; returns its move
/// counts.
pub fn assert_matches_topic_model(cfg: &KafkaConfig, index: &Path) -> (usize, usize) {
    assert_matches_model_of_logs(&read_decodable(cfg), index)
}

/// [`assert_matches_topic_model`] of logs read already.
pub fn assert_matches_model_of_logs(logs: &[Vec<(i64, denorm::codec::Decoded)>], index: &Path) -> (usize, usize) {
    let (m, moves, chunked) = model_of_logs(logs);
    let commands: Vec<(LogPosition, &Command)> = logs
        .iter()
        .enumerate()
        .flat_map(|(p, l)| {
            l.iter().filter_map(move |(o, d)| match d {
                denorm::codec::Decoded::Command(e) => Some((LogPosition { partition: p as i32, offset: *o }, &e.command)),
                _ => None,
            })
        })
        .collect();
    assert_equals(&m, index, &commands);
    (moves, chunked)
}

/// `denorm verify` of `group` on `index` finds the index equal to the
/// replay of its log (issue 31): exit status 0, no difference.
pub fn assert_verify_clean(cfg: &KafkaConfig, group: &str, index: &Path) {
    // Everything is applied by then: one round (nothing is written since).
    let (code, out, err) = output(cli(cfg, group, index).args(["verify", "--json", "--rounds", "1"]));
    assert_eq!(code, 0, "denorm verify found differences or could not verify:\n{out}\n{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["differences_total"], 0, "{report}");
}

/// Every message of the topic, decoded, partition by partition.
pub fn read_topic(cfg: &KafkaConfig) -> Vec<Vec<(i64, denorm::codec::Decoded)>> {
    kafka::read_topic(cfg, &denorm::codec::Codec::new()).unwrap()
}

/// The time between the first line of a worker's log containing `from`
/// and the first one after it containing `to`, by the timestamps the
/// worker wrote (RFC 3339, UTC): what the worker did, without the
/// process's start or exit around it.
pub fn log_gap(log: &str, from: &str, to: &str) -> Duration {
    let at = |line: &str| -> f64 {
        // `2026-11-27T05:30:01.123456Z  INFO ...`: seconds of the day.
        let time = line.split_whitespace().next().and_then(|t| t.split('T').nth(1)).unwrap_or_else(|| panic!("no timestamp: {line}"));
        let mut hms = time.trim_end_matches('Z').split(':').map(|x| x.parse::<f64>().unwrap_or_else(|_| panic!("no timestamp: {line}")));
        hms.next().unwrap() * 3600.0 + hms.next().unwrap() * 60.0 + hms.next().unwrap()
    };
    let mut lines = log.lines().skip_while(|l| !l.contains(from));
    let first = lines.next().unwrap_or_else(|| panic!("no {from:?} in the log:\n{log}"));
    let second = lines.find(|l| l.contains(to)).unwrap_or_else(|| panic!("no {to:?} after {from:?} in the log:\n{log}"));
    // A midnight between the two lines.
    let gap = (at(second) - at(first)).rem_euclid(86_400.0);
    Duration::from_secs_f64(gap)
}

/// The partitions of a worker's last "partitions assigned" log line.
pub fn last_assignment(w: &Worker) -> BTreeSet<i32> {
    let log = w.log();
    let line = log.lines().rfind(|l| l.contains("partitions assigned")).unwrap_or_else(|| panic!("no assignment:\n{log}"));
    let list = line.split("partitions=[").nth(1).and_then(|r| r.split(']').next()).unwrap_or_else(|| panic!("unparsed: {line}"));
    list.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect()
}

/// Waits until `workers`' last assignments split all `n` partitions among
/// them, each having received its assignment since its last revoke (a
/// rebalance has completed for every one of them).
pub fn wait_covered(workers: &[&Worker], n: i32) {
    let logs = || workers.iter().map(|w| w.log()).collect::<Vec<_>>().join("\n----- next worker -----\n");
    eventually(
        Duration::from_secs(120),
        || format!("the group never split the {n} partitions among its {} members:\n{}", workers.len(), logs()),
        || {
            // A member whose last word is a revoke is in a rebalance.
            let settled = |w: &&Worker| w.log().lines().rfind(|l| l.contains("partitions assigned") || l.contains("partitions revoked")).is_some_and(|l| l.contains("partitions assigned"));
            if !workers.iter().all(settled) {
                return None;
            }
            let sets: Vec<BTreeSet<i32>> = workers.iter().map(|w| last_assignment(w)).collect();
            let all: BTreeSet<i32> = sets.iter().flatten().copied().collect();
            (sets.iter().map(BTreeSet::len).sum::<usize>() == n as usize && all.len() == n as usize).then_some(())
        },
    )
}

/// Every message of the topic by key, each key's payloads in log order.
pub fn per_key(cfg: &denorm::kafka::KafkaConfig) -> std::collections::BTreeMap<Vec<u8>, Vec<Vec<u8>>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let mut c = cfg.client_config();
    c.set("group.id", unique("read")).set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create().unwrap();
    let partitions = cfg.topic_partitions().unwrap().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    let mut left = 0;
    for p in 0..partitions {
        tpl.add_partition_offset(&cfg.topic, p, rdkafka::Offset::Beginning).unwrap();
        left += consumer.fetch_watermarks(&cfg.topic, p, Duration::from_secs(10)).unwrap().1;
    }
    consumer.assign(&tpl).unwrap();
    let mut out: std::collections::BTreeMap<Vec<u8>, Vec<Vec<u8>>> = Default::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while left > 0 {
        assert!(Instant::now() < deadline, "{left} messages of {} not read", cfg.topic);
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            out.entry(m.key().unwrap_or_default().to_vec()).or_default().push(m.payload().unwrap_or_default().to_vec());
            left -= 1;
        }
    }
    out
}
