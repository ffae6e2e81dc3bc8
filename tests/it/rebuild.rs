//! `denorm rebuild` on a real broker, with a live worker, commands produced
//! throughout, searches running throughout, and crashes in the middle of the
//! rebuild and of its cutover.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::generations::{ElasticGenerations, EmbeddedGenerations, Generations};
use denorm::index::{FileQuery, SearchIndex};

/// Counts the files of the current generation as searches see them (a
/// client of its own, for a thread of its own): on Elasticsearch a
/// `_count` through the read alias, as a scan of every file would load the
/// server more than the rebuild does.
fn file_counter(index: &std::path::Path) -> Box<dyn FnMut() -> usize + Send> {
    if elastic::is_url(index) {
        let (url, rt) = (index.to_string_lossy().into_owned(), rt());
        let b = elastic::backend(&url, &rt, "");
        let alias = denorm::index::elastic::names::alias(&b.prefix, denorm::index::Kind::File);
        return Box::new(move || {
            let v: serde_json::Value = rt.block_on(async {
                let r = b
                    .client
                    .count(elasticsearch::CountParts::Index(&[&alias]))
                    .body(serde_json::json!({"query": {"bool": {"must_not": [denorm::index::elastic::docs::is_deleted()]}}}))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status_code().is_success(), "counting {alias}: {}", r.status_code());
                r.json().await.unwrap()
            });
            assert_eq!(v["_shards"]["failed"].as_u64(), Some(0), "{v}");
            v["count"].as_u64().unwrap() as usize
        });
    }
    let index = EmbeddedIndex::open_existing(index).unwrap();
    Box::new(move || {
        let mut n = 0;
        index.search().unwrap().files(&FileQuery::default(), 0, &mut |_| n += 1).unwrap();
        n
    })
}

/// The generations of the rig's index, on either backend (`rt` runs the
/// Elasticsearch requests).
pub(crate) fn generations_of(r: &Rig, rt: &tokio::runtime::Runtime) -> Box<dyn Generations> {
    if r.is_elastic() {
        return Box::new(ElasticGenerations::new(elastic::backend(&r.index.to_string_lossy(), rt, &r.cfg.topic)));
    }
    Box::new(EmbeddedGenerations { index: EmbeddedIndex::open_existing(&r.index).unwrap(), budget: 20 << 20 })
}

/// `denorm rebuild` of the rig's topic and index.
fn rebuild(r: &Rig, faults: &[(&str, &str)]) -> std::process::Child {
    rebuild_with(r, faults, &[])
}

/// [`rebuild`] with more arguments.
fn rebuild_with(r: &Rig, faults: &[(&str, &str)], args: &[&str]) -> std::process::Child {
    rebuild_in(r, "rebuild-faults", faults, args)
}

/// [`rebuild_with`], its faults in a directory of its own.
pub(crate) fn rebuild_in(r: &Rig, faults_dir: &str, faults: &[(&str, &str)], args: &[&str]) -> std::process::Child {
    rebuild_with_env(r, faults_dir, faults, args, &[])
}

/// [`rebuild_in`] with more environment variables.
pub(crate) fn rebuild_with_env(r: &Rig, faults_dir: &str, faults: &[(&str, &str)], args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let faults_dir = r.dir().join(faults_dir);
    let _ = std::fs::remove_dir_all(&faults_dir);
    std::fs::create_dir_all(&faults_dir).unwrap();
    for (name, arg) in faults {
        std::fs::write(faults_dir.join(name), arg).unwrap();
    }
    cli(&r.cfg, &r.group, &r.index)
        .args(["rebuild", "--metrics-addr", "127.0.0.1:0"])
        .args(args)
        .env("DENORM_FAULTS", &faults_dir)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: std::process::Child) -> (std::process::ExitStatus, String) {
    let o = child.wait_with_output().unwrap();
    (o.status, format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn a_rebuild_under_load_survives_kill_9_and_cuts_over_without_searches_seeing_a_partial_index() {
    rebuild_under_load(Rig::new(3), 30_000, 200, Duration::ZERO);
}

/// On Elasticsearch the cutover is the one `_aliases` request moving the
/// read aliases: searches through them never see a partial or empty index.
#[test]
fn a_rebuild_under_load_survives_kill_9_and_cuts_over_without_searches_seeing_a_partial_index_on_elasticsearch() {
    // Commands at about 20/s: the server of the suite (one process, on the
    // test machine's two cores) also serves the live worker and the
    // searches, and the rebuild applied only 50-130 commands/s beside them
    // (one realtime GET per command, commits of ~10 commands): at 200/s it
    // never caught up.
    rebuild_under_load(Rig::elastic(3), 5_000, 20, Duration::from_secs(1));
}

/// `files` files loaded, then a rebuild killed twice while a producer
/// sends `batch` files every `pace` and searches count the files
/// throughout.
fn rebuild_under_load(r: Rig, files: usize, batch: usize, pace: Duration) {
    let live = r.worker(&[]);
    let mut log = produce(&r.cfg, denorm::demo::seed(files, 100, 1000, 11));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    let baseline = file_counter(&r.index)();
    assert!(baseline > files * 5 / 6, "{baseline}");
    let runtime = rt();
    let index = generations_of(&r, &runtime);

    // Searches throughout: never an empty or half-built generation. Only
    // files are added from here on, so fewer files than before the rebuild
    // would be a half-built generation.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<(usize, usize)>> = Arc::new(Mutex::new((usize::MAX, 0)));
    let searcher = {
        let (mut files_in, stop, seen) = (file_counter(&r.index), stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let n = files_in();
                let mut s = seen.lock().unwrap();
                s.0 = s.0.min(n);
                s.1 += 1;
            }
        })
    };
    // Commands produced throughout.
    let producer = produce_throughout(&r.cfg, &stop, batch, pace, 5);

    // 1. kill -9 in the middle of the rebuild.
    let mut child = rebuild(&r, &[]);
    // Not `eventually`: this races the rebuild, polling every 5 ms, to kill
    // it in the middle of its work.
    let deadline = Instant::now() + Duration::from_secs(120);
    while index.checkpoints_in(1, 3).unwrap().is_empty() {
        assert!(Instant::now() < deadline && child.try_wait().unwrap().is_none(), "the rebuild made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let (status, text) = finish(child);
    assert!(!status.success());
    assert_eq!(index.current().unwrap(), 0, "the rebuild finished before it was killed:\n{text}");

    // 2. Resumed, compared with the live generation under load (--verify:
    // no false difference), and killed right after the cutover (abort, as
    // kill -9).
    // `--verify` on the embedded index only: on Elasticsearch the suite's
    // time is spent elsewhere (`--verify` is tested on both backends in
    // `a_rebuild_verifies_the_new_generation_before_its_cutover`).
    let verify: &[&str] = if r.is_elastic() { &[] } else { &["--verify"] };
    let (status, text) = finish(rebuild_with(&r, &[("rebuild.after-cutover", "")], verify));
    assert!(!status.success(), "{text}");
    assert!(text.contains("resuming the rebuild in progress") && text.contains("cut over"), "{text}");
    if !r.is_elastic() {
        assert!(text.lines().any(|l| l.contains("compared the generations") && l.contains("differences=0")), "a false difference under load:\n{text}");
    }
    assert_eq!(index.current().unwrap(), 1);

    // 3. Resumed again: only the clean-up was left.
    let (status, text) = finish(rebuild(&r, &[]));
    assert!(status.success(), "{text}");
    assert!(text.contains("rebuilt generation 1"), "{text}");

    stop.store(true, Ordering::SeqCst);
    log.extend(producer.join().unwrap());
    searcher.join().unwrap();
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    assert!(live.wait_for_log("the index moved to a new generation", Duration::from_secs(30)), "{}", live.log());
    // The live worker applies what arrived after the cutover to generation 1.
    wait_caught_up(&r, index.as_ref(), 1, &live);
    let (status, text) = live.terminate_with_log();
    assert!(status.success(), "{text}");
    assert_matches_model(&r.index, &log);

    let (min, searches) = *seen.lock().unwrap();
    assert!(searches > 10, "only {searches} searches ran");
    assert!(min >= baseline, "a search saw {min} files, fewer than the {baseline} before the rebuild");
    assert_eq!(index.list().unwrap(), vec![1], "the old generation is deleted");
    let (code, out, err) = output(cli(&r.cfg, &r.group, &r.index).args(["rebuild", "--status", "--json"]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["current"], 1);
    assert_eq!(v["rebuild"], serde_json::Value::Null);
    eprintln!("rebuild under load: {} commands in the log, {searches} searches, fewest files seen {min} (baseline {baseline})", log.len());
}

/// Every message of the topic, per key in log order.

#[test]
fn more_partitions_through_migrate_and_a_rebuild_from_the_new_topic() {
    let r = Rig::new(2);
    let live = r.worker(&[]);
    let mut cmds = denorm::demo::seed(3000, 40, 400, 21);
    cmds.extend(denorm::demo::user_renames(10, 21));
    let (a, b) = denorm::demo::race();
    cmds.extend([a, b]);
    let log = produce(&r.cfg, cmds);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);

    // The producers are paused; the topic is copied into one of 5 partitions.
    let new = denorm::kafka::KafkaConfig { topic: unique("denorm-test-grown"), partitions: 5, ..r.cfg.clone() };
    let (code, out, err) = output(cli(&r.cfg, &r.group, &r.index).args(["migrate", "--to-topic", &new.topic, "--to-partitions", "5"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("copied {} messages", log.len())), "{out}");
    assert_eq!(per_key(&new), per_key(&r.cfg), "every key's commands, in the same order");
    let (code, _, err) = output(cli(&r.cfg, &r.group, &r.index).args(["migrate", "--to-topic", &new.topic, "--to-partitions", "5"]));
    assert_ne!(code, 0);
    assert!(err.contains("already holds messages"), "{err}");

    // The index is rebuilt from the new topic while the old worker runs.
    let (code, out, err) = output(cli(&new, &r.group, &r.index).args(["rebuild", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("from 5 partitions"), "{out}");
    // The old worker must not write to an index now built from another topic.
    let (status, text) = live.wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    assert!(text.contains(&format!("belongs to topic {:?}, not {:?}", new.topic, r.cfg.topic)), "{text}");

    // Workers on the new topic carry on from the rebuilt index.
    let w = Worker::start(&new, &r.group, &r.index, &[]);
    let more = produce(&new, files_under("after", "/grown", 500));
    let lag = |cfg: &denorm::kafka::KafkaConfig| denorm::kafka::group_lag(cfg, &r.group).unwrap();
    wait_applied_by(&new, &r.group, log.len() + more.len(), &[&w]);
    assert_eq!(lag(&new).total, 0);
    let (status, text) = w.terminate_with_log();
    assert!(status.success(), "{text}");
    // The model of the old log (its per-key order is the new topic's) plus
    // what came after.
    let mut all = log;
    all.extend(more);
    assert_matches_model(&r.index, &all);
}

/// A live worker whose shard is reopened after an index failure, while a
/// cutover moved the index to another generation, resumes at that
/// generation's checkpoint. Re-applying its uncommitted batch onto the new
/// generation from where the batch began would skip every command between
/// the new generation's checkpoint and the batch.
#[test]
fn a_worker_reopening_its_shard_onto_a_new_generation_resumes_at_that_generations_checkpoint() {
    let r = Rig::new(1);
    let mut log = produce(&r.cfg, files_under("a-", "/a", 500));
    let live = r.worker(&[]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    assert!(live.terminate().success());
    // Generation 1: generation 0 as it is now (checkpoint at offset 499).
    copy_dir(&r.index.join("shards"), &r.index.join("generations").join("1"));
    let index = EmbeddedIndex::open_existing(&r.index).unwrap();
    assert_eq!(index.checkpoints_in(1).unwrap()[&0].offset, 499);

    let live = r.worker(&[]);
    log.extend(produce(&r.cfg, files_under("b-", "/b", 500)));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    // Generation 0 is at offset 999. The next batch cannot be committed.
    r.on_fault("index.io", "");
    log.extend(produce(&r.cfg, files_under("c-", "/c", 300)));
    assert!(live.wait_for_log("index commit failed, retrying", Duration::from_secs(60)), "{}", live.log());
    // The cutover happens meanwhile, and the shard is reopened (again and
    // again, while commits fail) after it; then the index recovers.
    let failures = || live.log().matches("failed, retrying").count();
    let before = failures();
    index.set_current_generation(1).unwrap();
    eventually(Duration::from_secs(60), || format!("no retries after the cutover:\n{}", live.log()), || (failures() >= before + 3).then_some(()));
    r.off_fault("index.io");
    assert!(live.wait_for_log("the index moved to a new generation during a batch", Duration::from_secs(60)), "{}", live.log());
    eventually(
        Duration::from_secs(60),
        || format!("generation 1 never caught up: {:?}\n{}", index.checkpoints_in(1), live.log()),
        || index.checkpoints_in(1).unwrap().get(&0).is_some_and(|c| c.offset >= 1299).then_some(()),
    );
    let (status, text) = live.terminate_with_log();
    assert!(status.success(), "{text}");
    // Generation 1 holds the commands between its checkpoint and the batch.
    assert_matches_model(&r.index, &log);
}

/// Issue 29, 6: partitions added to the command topic in place moved keys
/// to other partitions. The workers refuse such a topic; `rebuild`
/// compared only the topic's name and replayed it, splitting keys between
/// shards. It refuses it, before writing any rebuild state, and points to
/// `migrate`.
/// On noida-db's Kafka broker: tansu 0.6 cannot add partitions.
#[test]
fn a_rebuild_refuses_a_topic_whose_partitions_were_added_in_place() {
    rebuild_refuses_added_partitions(Rig::on(Broker::noida(), 2));
}

#[test]
fn a_rebuild_refuses_a_topic_whose_partitions_were_added_in_place_on_elasticsearch() {
    rebuild_refuses_added_partitions(Rig::elastic_on(Broker::noida(), 2));
}

fn rebuild_refuses_added_partitions(r: Rig) {
    let live = r.worker(&[]);
    let log = produce(&r.cfg, files_under("before", "/grown", 50));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    let (status, text) = live.terminate_with_log();
    assert!(status.success(), "{text}");
    add_partitions(&r.cfg, 3);
    let (status, out) = finish(rebuild(&r, &[]));
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("has 3 partitions, but the index was built from it with 2"), "{out}");
    assert!(out.contains("denorm migrate --to-topic NEW --to-partitions 3"), "{out}");
    let rt = crate::common::rt();
    assert!(generations_of(&r, &rt).state().unwrap().is_none(), "a refused rebuild left its state behind");
}

/// Grows the topic to `total` partitions in place (CreatePartitions), and
/// waits until the metadata shows them.
fn add_partitions(cfg: &denorm::kafka::KafkaConfig, total: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    use rdkafka::client::DefaultClientContext;
    crate::common::rt().block_on(async {
        let admin: AdminClient<DefaultClientContext> = cfg.client_config().create().unwrap();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in admin.create_partitions(&[NewPartitions::new(&cfg.topic, total as usize)], &opts).await.unwrap() {
            r.unwrap_or_else(|(t, e)| panic!("adding partitions to {t}: {e}"));
        }
        eventually(Duration::from_secs(30), || format!("topic {} does not show {total} partitions", cfg.topic), || (cfg.topic_partitions().unwrap() == Some(total)).then_some(()));
    });
}

#[test]
fn a_rebuild_left_unfinished_is_resumed_from_its_own_topic_only_and_abandon_gives_it_up() {
    rebuild_left_unfinished(Rig::new(2));
}

#[test]
fn a_rebuild_left_unfinished_is_resumed_from_its_own_topic_only_and_abandon_gives_it_up_on_elasticsearch() {
    rebuild_left_unfinished(Rig::elastic(2));
}

/// Issue 29, 10: a rebuild killed and rerun with another `--topic` used to
/// resume the generation of the first and loop on the log mismatch; there
/// was no way to give a rebuild up.
fn rebuild_left_unfinished(r: Rig) {
    let live = r.worker(&[]);
    let log = produce(&r.cfg, files_under("f", "/left", 20));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    assert!(live.terminate().success());
    // A rebuild from another topic that did not finish (as a kill leaves
    // it): its state, and the generation it began.
    let rt = crate::common::rt();
    let g = generations_of(&r, &rt);
    g.prepare(1).unwrap();
    let state = denorm::index::generations::State { generation: 1, group: s("gone"), topic: Some(s("another-topic")), partitions: Some(2), ..Default::default() };
    g.save_state(&state).unwrap();
    let (status, out) = finish(rebuild(&r, &[]));
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("from topic another-topic (2 partitions) did not finish") && out.contains("--abandon"), "{out}");
    let (code, out, err) = r.run(&["rebuild", "--abandon"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gave up the rebuild of generation 1"), "{out}");
    assert!(g.state().unwrap().is_none());
    assert_eq!(g.list().unwrap(), vec![0], "the generation it began is deleted");
    // Now the rebuild of this topic runs.
    let (status, out) = finish(rebuild(&r, &[]));
    assert!(status.success(), "{out}");
    assert_eq!(g.current().unwrap(), 1);
    assert_matches_model(&r.index, &log);
    // Issue 29, 13: a rebuild's worker commits no offsets (its positions are
    // its shards' checkpoints): its group is left with none behind.
    let line = out.lines().find(|l| l.contains("joins a consumer group of its own")).unwrap_or_else(|| panic!("the rebuild's group is not in its log:\n{out}"));
    let group = line.split("group=").nth(1).and_then(|g| g.split_whitespace().next()).unwrap_or_default();
    assert!(group.starts_with(&format!("{}.rebuild-", r.group)), "{line}");
    let offsets = denorm::kafka::group_lag(&r.cfg, group).unwrap();
    assert!(offsets.partitions.iter().all(|p| p.committed <= 0), "{group}: {offsets:?}");
}

/// Issue 29, 11: on Elasticsearch, where partitions share documents, an
/// owner change sent without its explicit form is decided by which writer
/// comes first, live and in a replay alike: a rebuild could cut over to a
/// generation that differs from the live one. The rebuild counts those
/// documents, names them and does not cut over unless told to.
#[test]
fn a_rebuild_that_meets_owner_conflicts_names_them_and_does_not_cut_over_on_elasticsearch() {
    let r = Rig::elastic(2);
    let other = (0..).map(|n| format!("/b{n}")).find(|t| denorm::command::partitioner::partition_of(t, 2) != denorm::command::partitioner::partition_of("/a", 2)).unwrap();
    let live = r.worker(&[]);
    let file = |path: &str| denorm::command::Command::UpsertFile { id: s("f"), path: s(path), contents: s("x"), previous_path: None };
    // `f` written under /a, then under another tree without previous_path.
    let log = produce(&r.cfg, vec![file("/a/f.txt"), file(&format!("{other}/f.txt"))]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    assert!(live.metric("denorm_owner_conflicts_total", &[]) >= 1.0, "{}", live.log());
    assert!(live.terminate().success());
    let (status, out) = finish(rebuild(&r, &[]));
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("met 1 document(s) held by another key's partition") && out.contains("file/f") && out.contains("--accept-owner-conflicts"), "{out}");
    let rt = crate::common::rt();
    let g = generations_of(&r, &rt);
    assert_eq!(g.current().unwrap(), 0, "no cutover");
    assert_eq!(g.state().unwrap().map(|s| s.owner_conflicts), Some(vec![s("file/f")]), "kept for a resumed run");
    let child = cli(&r.cfg, &r.group, &r.index).args(["rebuild", "--metrics-addr", "127.0.0.1:0", "--accept-owner-conflicts"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (status, out) = finish(child);
    assert!(status.success(), "{out}");
    assert_eq!(g.current().unwrap(), 1);
}

/// `rebuild --verify`: the new generation compared with the live one
/// before the cutover, with the live worker running. Equal: it cuts over
/// and says what it compared. A document of the live generation changed
/// behind the pipeline's back: it names the document and does not cut
/// over; `--force` does, and the index then equals its log.
fn a_rebuild_verifies_the_new_generation_before_its_cutover(r: Rig) {
    let worker = r.worker(&[]);
    let log = produce(&r.cfg, files_under("rv", "/rv", 300));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&worker]);
    let rt = crate::common::rt();
    let g = generations_of(&r, &rt);
    let rebuild_verify = |extra: &[&str]| r.run(&[&["rebuild", "--verify", "--metrics-addr", "127.0.0.1:0"], extra].concat());
    let (code, out, err) = rebuild_verify(&[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("verified before the cutover: 300 document(s) of generation 1") && out.contains(": equal"), "{out}");
    assert_eq!(g.current().unwrap(), 1);

    let log = worker.log();
    assert!(worker.terminate().success(), "{log}");
    crate::verify::corrupt(&r, "rv7", "/rv", "corrupted");
    let worker = r.worker(&[]);
    let (code, out, err) = rebuild_verify(&[]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("differs from the live generation in 1 document(s)") && err.contains("file rv7: differs in contents") && err.contains("--force"), "{err}");
    assert_eq!(g.current().unwrap(), 1, "no cutover");
    let (code, out, err) = rebuild_verify(&["--force"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("1 differed, cut over anyway (--force)"), "{out}");
    assert_eq!(g.current().unwrap(), 2);
    let (code, out, err) = r.run(&["verify"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", worker.log());
    assert!(worker.terminate().success());
}

#[test]
fn a_rebuild_verifies_the_new_generation_before_its_cutover_on_the_embedded_index() {
    a_rebuild_verifies_the_new_generation_before_its_cutover(Rig::new(2));
}

#[test]
fn a_rebuild_verifies_the_new_generation_before_its_cutover_on_elasticsearch() {
    a_rebuild_verifies_the_new_generation_before_its_cutover(Rig::elastic(2));
}

/// Review of Elasticsearch, F4 (b): the live workers go on during
/// `rebuild --verify`, whose comparison takes about as long as the
/// rebuild. It cut over at once after the verify, so searches read the new
/// generation without what they applied meanwhile, until they followed it
/// and applied it again. Here the live worker applies 40 more files while
/// the rebuild is held after its verify, and stops before the rebuild goes
/// on: the new generation must have them when it is cut over to.
fn a_rebuild_builds_on_after_its_verify_with_what_the_live_workers_applied_meanwhile(r: Rig) {
    let worker = r.worker(&[]);
    let log = produce(&r.cfg, files_under("rb", "/rb", 100));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&worker]);
    let child = rebuild_with(&r, &[("rebuild.verified", "")], &["--verify"]);
    let reached = r.dir().join("rebuild-faults").join("rebuild.verified.reached");
    eventually(Duration::from_secs(120), || "the rebuild never ended its verify".into(), || reached.exists().then_some(()));
    let late = produce(&r.cfg, files_under("late", "/late", 40));
    wait_applied_by(&r.cfg, &r.group, log.len() + late.len(), &[&worker]);
    let worker_log = worker.log();
    assert!(worker.terminate().success(), "{worker_log}");
    std::fs::remove_file(r.dir().join("rebuild-faults").join("rebuild.verified")).unwrap();
    let (status, out) = finish(child);
    assert!(status.success(), "{out}");
    assert!(out.contains("building on until the new generation has them too"), "{out}");
    let rt = crate::common::rt();
    assert_eq!(generations_of(&r, &rt).current().unwrap(), 1);
    let late_files = dump(&r.index).into_iter().filter(|d| d.id().starts_with("late")).count();
    assert_eq!(late_files, 40, "the new generation was cut over to without the files the live worker applied during the verify");
}

#[test]
fn a_rebuild_builds_on_after_its_verify_with_what_the_live_workers_applied_meanwhile_on_the_embedded_index() {
    a_rebuild_builds_on_after_its_verify_with_what_the_live_workers_applied_meanwhile(Rig::new(2));
}

#[test]
fn a_rebuild_builds_on_after_its_verify_with_what_the_live_workers_applied_meanwhile_on_elasticsearch() {
    a_rebuild_builds_on_after_its_verify_with_what_the_live_workers_applied_meanwhile(Rig::elastic(2));
}

/// Issue 43, 2: `rebuild --members 2`, the two processes a Job with
/// `parallelism: 2` runs, each building the shards of its partitions, under
/// load; member 1 is killed (SIGKILL) in the middle and replaced under its
/// number, as the Job replaces its pod. One cutover, by member 0, once every
/// partition has caught up, and the new generation equals the model of the
/// log.
#[test]
fn a_rebuild_by_two_members_with_one_killed_midway_cuts_over_once_and_ends_exact() {
    rebuild_by_members(Rig::new(4), 30_000, 100, Duration::ZERO);
}

#[test]
fn a_rebuild_by_two_members_with_one_killed_midway_cuts_over_once_and_ends_exact_on_elasticsearch() {
    rebuild_by_members(Rig::elastic(4), 3_000, 10, Duration::from_secs(1));
}

fn rebuild_by_members(r: Rig, files: usize, batch: usize, pace: Duration) {
    let live = r.worker(&[]);
    // A key first in each partition, which member 1 holds before applying
    // (`apply.hold`): whatever partitions it is given, it is killed in the
    // middle of them.
    let held: Vec<String> = (0..r.cfg.partitions).map(|p| (0..).map(|n| format!("/held{n}")).find(|k| denorm::command::partitioner::partition_of(k, r.cfg.partitions) == p).unwrap()).collect();
    let mut log = produce(&r.cfg, held.iter().map(|k| denorm::command::Command::UpsertFile { id: format!("h{k}"), path: format!("{k}/h.txt"), contents: s("held"), previous_path: None }).collect());
    log.extend(produce(&r.cfg, denorm::demo::seed(files, 100, 1000, 17)));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    let runtime = rt();
    let index = generations_of(&r, &runtime);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce_throughout(&r.cfg, &stop, batch, pace, 7);
    let hold = held.join("\n");
    let member = |i: u32, faults_dir: &str, faults: &[(&str, &str)]| rebuild_in(&r, faults_dir, faults, &["--members", "2", "--member", &i.to_string()]);
    let mut first = member(0, "member-0-faults", &[]);
    let mut second = member(1, "member-1-faults", &[("apply.hold", &hold)]);
    let reached = r.dir().join("member-1-faults").join("apply.hold.reached");
    eventually(
        Duration::from_secs(120),
        || "member 1 never reached its partitions' first command".into(),
        || {
            assert!(first.try_wait().unwrap().is_none() && second.try_wait().unwrap().is_none(), "a member exited first");
            reached.exists().then_some(())
        },
    );
    second.kill().unwrap();
    // On Elasticsearch the generation is built without refreshes or
    // replicas, and served with the live generation's settings.
    let settings = |g: u64| {
        let b = elastic::backend(&r.index.to_string_lossy(), &runtime, &r.cfg.topic);
        runtime.block_on(denorm::index::elastic::bulk_load::serving(&b.client, &b.prefix, g)).unwrap()
    };
    let live_settings = r.is_elastic().then(|| settings(0));
    if r.is_elastic() {
        for s in settings(1) {
            assert_eq!((s.get("index.refresh_interval").map(String::as_str), s.get("index.number_of_replicas").map(String::as_str)), (Some("-1"), Some("0")), "while built: {s:?}");
        }
    }
    let (status, text) = finish(second);
    assert!(!status.success());
    assert!(!text.contains("stopped: the partitions this member held are committed"), "member 1 had finished its part before it was killed:\n{text}");
    let killed_held = assigned(&text);
    assert_eq!(index.current().unwrap(), 0, "cut over before member 1 was killed:\n{text}");
    // Replaced under its number: it takes its partitions back and resumes
    // them from their checkpoints.
    let (status, second_text) = finish(member(1, "member-1-replaced-faults", &[]));
    assert!(status.success(), "{second_text}");
    assert!(second_text.contains("joining the rebuild member 0 recorded") && second_text.contains("member 0 cut over"), "{second_text}");
    let (status, first_text) = finish(first);
    assert!(status.success(), "{first_text}");
    assert!(first_text.contains("rebuilt generation 1"), "{first_text}");
    assert_eq!(first_text.matches("cut over: searches and live workers use the new generation").count(), 1, "{first_text}");
    assert!(!second_text.contains("cut over: searches and live workers"), "member 1 cut over:\n{second_text}");
    // The work was split, and the replacement took the killed member's
    // partitions back (a static member of the rebuild's group).
    let (first_held, second_held) = (assigned(&first_text), assigned(&second_text));
    assert!(!killed_held.is_empty() && !first_held.is_empty(), "member 0 held {first_held:?}, member 1 {killed_held:?}");
    assert_eq!(second_held, killed_held, "the replaced member 1 did not take its partitions back");
    assert_eq!(index.current().unwrap(), 1);
    if let Some(live) = live_settings {
        assert_eq!(settings(1), live, "the new generation serves with the live generation's settings");
    }
    assert_eq!(index.list().unwrap(), vec![1], "the old generation is deleted");
    assert!(index.state().unwrap().is_none() && index.member_report(1).unwrap().is_none(), "the rebuild's records are left behind");

    stop.store(true, Ordering::SeqCst);
    log.extend(producer.join().unwrap());
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&live]);
    assert!(live.wait_for_log("the index moved to a new generation", Duration::from_secs(30)), "{}", live.log());
    wait_caught_up(&r, index.as_ref(), 1, &live);
    let (status, text) = live.terminate_with_log();
    assert!(status.success(), "{text}");
    assert_matches_model(&r.index, &log);
    eprintln!("rebuild by two members: {} commands in the log", log.len());
}

/// Every partition a process's log says it was assigned.
fn assigned(log: &str) -> std::collections::BTreeSet<i32> {
    log.lines()
        .filter(|l| l.contains("partitions assigned"))
        .filter_map(|l| l.split("partitions=[").nth(1)?.split(']').next().map(String::from))
        .flat_map(|list| list.split(',').filter_map(|p| p.trim().parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// A thread producing `batch` files under one of `trees` top-level
/// directories every `pace` until `stop`; it returns what it produced.
fn produce_throughout(
    cfg: &denorm::kafka::KafkaConfig,
    stop: &Arc<AtomicBool>,
    batch: usize,
    pace: Duration,
    trees: usize,
) -> std::thread::JoinHandle<Vec<(denorm::command::LogPosition, denorm::command::Command)>> {
    let (cfg, stop) = (cfg.clone(), stop.clone());
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            out.extend(produce(&cfg, files_under(&format!("during{i}-"), &format!("/later{}", i % trees), batch)));
            i += 1;
            std::thread::sleep(pace);
        }
        out
    })
}

/// Waits until generation `g` has applied everything the live group has
/// (the live worker applies what arrived after the cutover to it).
fn wait_caught_up(r: &Rig, index: &dyn Generations, g: u64, live: &Worker) {
    let lag = denorm::kafka::group_lag(&r.cfg, &r.group).unwrap();
    eventually(
        Duration::from_secs(60),
        || format!("generation {g} never caught up: {:?}\n{}", index.checkpoints_in(g, r.cfg.partitions), live.log()),
        || {
            let at = index.checkpoints_in(g, r.cfg.partitions).unwrap();
            lag.partitions.iter().all(|p| p.end == 0 || at.get(&p.partition).is_some_and(|c| c.offset as i64 >= p.end - 1)).then_some(())
        },
    );
}
