//! What a failed test of the running system leaves to explain itself.
//! Every rig and worker a test starts is watched; when the test panics
//! (any assertion, any timeout), a hook prints, and writes under the
//! artifacts directory (`DENORM_TEST_ARTIFACTS`, else
//! `$TMPDIR/denorm-artifacts`), one directory per failed test:
//! - the dead-letter topic's count by reason, and its letters;
//! - every worker's log, killed ones included (one file each; their WARN
//!   and ERROR lines printed: refusals, parked keys, stops);
//! - per partition: the shard's checkpoint and done-above record and the
//!   group's committed offset and end;
//! - the first differing documents of a model comparison, with the
//!   positions of the commands that wrote their key;
//! - in report.txt, the panic: the assertion that failed, and where.
//!
//! The report never panics (a panic in a panic hook aborts the process):
//! each part that cannot be read says why instead.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};

use denorm::command::{Command, LogPosition};
use denorm::index::open::{Access, Embedded, Location};
use denorm::kafka::KafkaConfig;

/// A worker's captured log lines (shared with its reader thread).
pub type Lines = Arc<(Mutex<Vec<String>>, Condvar)>;

/// A topic, group and index a test uses, with what opening the index
/// takes: the model its workers run (`--model`), and the Elasticsearch
/// prefix they were given in their environment.
#[derive(Clone)]
struct Watched {
    cfg: KafkaConfig,
    group: String,
    index: PathBuf,
    model: Option<PathBuf>,
    prefix: Option<String>,
}

#[derive(Default)]
struct Scene {
    rigs: Vec<Watched>,
    workers: Vec<(u32, String, Lines)>,
    differences: Vec<String>,
}

static SCENE: Mutex<Option<Scene>> = Mutex::new(None);
static HOOK: Once = Once::new();
static REPORTED: AtomicBool = AtomicBool::new(false);
static LAST: Mutex<Option<String>> = Mutex::new(None);

/// The report the hook printed, if a panic made one (a test of the report).
pub fn last_report() -> Option<String> {
    LAST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn with_scene(f: impl FnOnce(&mut Scene)) {
    HOOK.call_once(install);
    let mut s = SCENE.lock().unwrap_or_else(|e| e.into_inner());
    f(s.get_or_insert_with(Scene::default));
}

/// Watches the topic, group and index of a rig or worker.
pub fn watch(cfg: &KafkaConfig, group: &str, index: &Path) {
    watch_worker(cfg, group, index, &[], &[]);
}

/// [`watch`] for a worker started with `args` and `env`: the model it runs
/// and its Elasticsearch prefix open the index for the report.
pub fn watch_worker(cfg: &KafkaConfig, group: &str, index: &Path, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) {
    let model = args.iter().position(|a| *a == "--model").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let prefix = env.iter().find(|(k, _)| *k == denorm::index::elastic::config::env::PREFIX).map(|(_, v)| v.to_string_lossy().into_owned());
    with_scene(|s| {
        let same = |w: &Watched| w.cfg.topic == cfg.topic && w.group == group && w.index == index && w.prefix == prefix;
        match s.rigs.iter_mut().find(|w| same(w)) {
            Some(w) => w.model = w.model.take().or(model),
            None => s.rigs.push(Watched { cfg: cfg.clone(), group: group.to_string(), index: index.to_path_buf(), model, prefix }),
        }
    });
}

/// Keeps a worker's log for the report, whatever becomes of the process.
pub fn keep_log(pid: u32, what: String, lines: Lines) {
    with_scene(|s| s.workers.push((pid, what, lines)));
}

/// Records what a failed comparison found, for the report.
pub fn differences(text: String) {
    with_scene(|s| s.differences.push(text));
}

/// The commands of `log` that name document `id` (upserts, deletes), and
/// every rename of those commands' keys, with their positions: what wrote
/// the key of a differing document.
pub fn writers_of(id: &str, log: &[(LogPosition, &Command)]) -> String {
    let names = |c: &Command| match c {
        Command::UpsertFile { id: i, .. } | Command::DeleteFile { id: i, .. } | Command::UpsertUser { id: i, .. } => i == id,
        Command::UpsertPost { id: i, user_id, .. } => i == id || user_id == id,
        _ => false,
    };
    let keys: std::collections::BTreeSet<&str> = log.iter().filter(|(_, c)| names(c)).map(|(_, c)| c.key()).collect();
    let mut out = String::new();
    for (shown, (at, c)) in log.iter().filter(|(_, c)| names(c) || (matches!(c, Command::RenamePath { .. }) && keys.contains(c.key()))).enumerate() {
        if shown == 40 {
            out.push_str("\n      ...");
            break;
        }
        let _ = write!(out, "\n      {}@{} key {:?}: {c:?}", at.partition, at.offset, c.key());
    }
    if out.is_empty() {
        out.push_str("\n      (no command of the log names it)");
    }
    out
}

fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if REPORTED.swap(true, Ordering::SeqCst) {
            return;
        }
        let test = std::thread::current().name().unwrap_or("test").replace("::", "-");
        let panic = info.to_string();
        // On a thread of its own: the panicking one may be inside a
        // runtime, where another cannot start.
        let text = std::thread::spawn(move || report(&test, &panic)).join().unwrap_or_else(|_| "(the failure report itself failed)".into());
        eprintln!("{text}");
        *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }));
}

fn artifacts(test: &str) -> PathBuf {
    let base = std::env::var_os("DENORM_TEST_ARTIFACTS").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("denorm-artifacts"));
    base.join(format!("{test}-{}", std::process::id()))
}

/// The report of `test`, which failed with `panic` (the assertion and
/// where, its first 4,000 characters also in report.txt).
fn report(test: &str, panic: &str) -> String {
    let (rigs, workers, differences) = {
        let s = SCENE.lock().unwrap_or_else(|e| e.into_inner());
        match &*s {
            Some(s) => (s.rigs.clone(), s.workers.clone(), s.differences.clone()),
            None => return String::new(),
        }
    };
    let dir = artifacts(test);
    let _ = std::fs::create_dir_all(&dir);
    let mut out = format!("\n===== failure report of {test} (files in {}) =====", dir.display());
    for d in &differences {
        let _ = write!(out, "\n--- differences\n{d}");
    }
    for w in &rigs {
        let prefix = w.prefix.as_ref().map(|p| format!(" (prefix {p})")).unwrap_or_default();
        let _ = write!(out, "\n--- topic {} group {} index {}{prefix}", w.cfg.topic, w.group, w.index.display());
        out.push_str(&partitions(w));
        out.push_str(&letters(&w.cfg, &dir));
    }
    for (n, (pid, what, lines)) in workers.iter().enumerate() {
        let text = lines.0.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
        let file = dir.join(format!("worker-{n}-{pid}.log"));
        let _ = std::fs::write(&file, format!("{what}\n{text}\n"));
        let notable: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ") || l.contains("ERROR")).collect();
        let _ = write!(out, "\n--- worker {n} (pid {pid}, {what}): {} lines in {}, {} WARN/ERROR", text.lines().count(), file.display(), notable.len());
        for l in notable.iter().take(30) {
            let _ = write!(out, "\n    {l}");
        }
        if notable.len() > 30 {
            let _ = write!(out, "\n    ... {} more in the file", notable.len() - 30);
        }
    }
    let shown: String = panic.chars().take(4000).collect();
    let _ = std::fs::write(dir.join("report.txt"), format!("--- {shown}\n{out}"));
    out
}

/// Per partition: committed offset, end, the shard's checkpoint and done-above record.
fn partitions(w: &Watched) -> String {
    let (cfg, group) = (&w.cfg, &w.group);
    let lag = denorm::kafka::group_lag(cfg, group);
    let parts: Vec<i32> = (0..cfg.partitions).collect();
    let model = match &w.model {
        Some(m) => match denorm::domain::Domain::load(m) {
            Ok(d) => Some(d.interned()),
            Err(e) => return format!("\n    (the model {} not read: {e})", m.display()),
        },
        None => None,
    };
    let env = |k: &str| match (k, &w.prefix) {
        (denorm::index::elastic::config::env::PREFIX, Some(p)) => Some(p.clone()),
        _ => std::env::var(k).ok(),
    };
    let applied = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string()).and_then(|rt| {
        rt.block_on(async {
            let location = Location::parse_with(&w.index, env).map_err(|e| e.to_string())?;
            let tuning = Embedded { model, ..Embedded::with_memory(15_000_000) };
            let backend = location.backend(&cfg.topic, Access::Existing, tuning).await.map_err(|e| e.to_string())?;
            let b = backend.clone();
            tokio::task::spawn_blocking(move || b.applied(&parts)).await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        })
    });
    let mut out = String::from("\n    partition  committed        end  checkpoint (fingerprint)  done above");
    let committed: BTreeMap<i32, (i64, i64)> = match &lag {
        Ok(r) => r.partitions.iter().map(|p| (p.partition, (p.committed, p.end))).collect(),
        Err(e) => {
            let _ = write!(out, "\n    (group offsets not read: {e})");
            BTreeMap::new()
        }
    };
    if let Err(e) = &applied {
        let _ = write!(out, "\n    (shards' progress not read: {e})");
    }
    for p in 0..cfg.partitions {
        let (c, end) = committed.get(&p).copied().unwrap_or((-1, -1));
        let a = applied.as_ref().ok().and_then(|a| a.get(&p));
        let checkpoint = a.and_then(|a| a.checkpoint).map(|c| format!("{} ({:?})", c.offset, c.fingerprint)).unwrap_or_else(|| "none".into());
        let done = a.map(|a| format!("through {} pending {:?}", a.done.through, a.done.pending)).unwrap_or_default();
        let _ = write!(out, "\n    {p:>9} {c:>10} {end:>10}  {checkpoint:<24}  {done}");
    }
    out
}

/// The dead-letter topic's count by reason and its letters (the first 50
/// printed, all in `letters.jsonl`).
fn letters(cfg: &KafkaConfig, dir: &Path) -> String {
    let dlq = denorm::dlq::default_topic(&cfg.topic);
    match denorm::dlq::admin::read(cfg, &dlq) {
        Err(e) => format!("\n    dead letters of {dlq} not read: {e}"),
        Ok((entries, markers)) => {
            let mut by: BTreeMap<&str, usize> = BTreeMap::new();
            for e in &entries {
                *by.entry(e.reason.as_str()).or_default() += 1;
            }
            let mut out = format!("\n    dead letters in {dlq}: {} {by:?}, {} markers", entries.len(), markers.len());
            let all: Vec<String> = entries.iter().map(|e| serde_json::to_string(e).unwrap_or_default()).collect();
            let _ = std::fs::write(dir.join(format!("letters-{}.jsonl", cfg.topic)), all.join("\n"));
            for e in entries.iter().take(50) {
                let _ = write!(out, "\n      {}@{} key {:?} {}: {}", e.origin_partition, e.origin_offset, e.key, e.reason, e.detail);
            }
            out
        }
    }
}
