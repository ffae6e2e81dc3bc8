//! The wire contract against implementations denorm did not write: Python
//! (fastavro + aiokafka), JavaScript (avsc + kafkajs) and Apache Avro's
//! reference implementation for Java (libavro-java, BinaryMessageEncoder).
//! Each producer reads `schemas/` only. `scripts/install-interop.sh`
//! installs them (scripts/test.sh runs it); these tests fail, rather than
//! skip, when they are missing.

use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::sync::OnceLock;

use crate::common::*;
use denorm::command::{Command, Envelope};
use denorm::produce::Producer;

/// Where scripts/install-interop.sh put the tools.
fn interop() -> PathBuf {
    let root = std::env::var("DENORM_INTEROP").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/denorm/interop"));
    assert!(root.join("py/bin/python").exists(), "no interop tools in {}: run scripts/install-interop.sh", root.display());
    root
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> Proc {
    python_script("denorm_interop.py")
}

/// Another script of tests/interop/python, run by the interop venv.
fn python_script(name: &str) -> Proc {
    let mut p = Proc::new(interop().join("py/bin/python"));
    p.arg(repo().join("tests/interop/python").join(name)).current_dir(repo());
    p
}

/// Another script of tests/interop/js, run by node with the interop packages.
fn node_script(name: &str) -> Proc {
    let mut p = Proc::new("node");
    p.arg(repo().join("tests/interop/js").join(name)).env("NODE_PATH", interop().join("node/node_modules")).current_dir(repo());
    p
}

fn node() -> Proc {
    node_script("denorm_interop.js")
}

/// Apache Avro for Java (Debian's jars) and its dependencies.
fn java_classpath() -> String {
    let jars = ["avro", "jackson-core-asl", "jackson-mapper-asl", "slf4j-api", "commons-compress", "paranamer", "snappy-java", "xz"];
    let found: Vec<String> = jars.iter().map(|j| format!("/usr/share/java/{j}.jar")).filter(|p| Path::new(p).exists()).collect();
    assert!(found.iter().any(|j| j.ends_with("/avro.jar")), "no /usr/share/java/avro.jar: run scripts/install-interop.sh");
    found.join(":")
}

/// The Java program, compiled once per test process.
fn java() -> Proc {
    static CLASSES: OnceLock<tempfile::TempDir> = OnceLock::new();
    let classes = CLASSES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = Proc::new("javac").args(["-nowarn", "-cp", &java_classpath(), "-d"]).arg(dir.path()).arg(repo().join("tests/interop/java/DenormInterop.java")).output().expect("run javac");
        assert!(out.status.success(), "javac failed:\n{}", String::from_utf8_lossy(&out.stderr));
        dir
    });
    let mut p = Proc::new("java");
    p.args(["-cp", &format!("{}:{}", java_classpath(), classes.path().display()), "DenormInterop"]).current_dir(repo());
    p
}

/// Runs `cmd` and returns its stdout; fails the test on a non-zero exit.
fn stdout_of(cmd: &mut Proc) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_schema_fingerprint_equals_fastavro_avsc_and_java() {
    let ours = denorm::codec::schema_fingerprints();
    let files: Vec<&str> = ours.iter().map(|f| f.file).collect();
    assert_eq!(
        files.len(),
        ["schemas", "schemas/history"].iter().flat_map(|d| std::fs::read_dir(repo().join(d)).unwrap()).filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "avsc")).count(),
        "a schema file is missing from codec::SCHEMA_FILES"
    );
    for (name, mut cmd) in [("fastavro", python()), ("avsc", node()), ("Apache Avro for Java", java())] {
        let theirs: serde_json::Value = serde_json::from_str(&stdout_of(cmd.arg("fingerprints").args(&files))).unwrap();
        for f in &ours {
            assert_eq!(theirs[f.file].as_str(), Some(f.fingerprint.as_str()), "{name} disagrees on {}", f.file);
            assert_ne!(f.legacy, f.fingerprint, "{}: the legacy alias is another fingerprint", f.file);
        }
    }
}

/// What the producers of tests/interop/* write for `prefix`, plus two
/// commands from denorm's producer on the same keys, whose partitions must
/// be the ones the foreign producer chose (the same murmur2 partitioner).
fn assert_scenario_applied(r: &Rig, w: &Worker, prefix: &str, foreign: &str, tenant: Option<&str>) {
    let deliveries = json_lines(foreign);
    assert_eq!(deliveries.len(), 17, "{foreign}");
    let partition_of = |key: &str| {
        let key = denorm::command::tenant::scope(tenant, key);
        let ps: Vec<i64> = deliveries.iter().filter(|d| d["key"] == key.as_str()).map(|d| d["partition"].as_i64().unwrap()).collect();
        assert!(!ps.is_empty() && ps.iter().all(|p| *p == ps[0]), "key {key} went to partitions {ps:?}");
        ps[0]
    };
    let (dir, user) = (format!("/{prefix}"), format!("{prefix}-u1"));
    let ours = produce(
        &r.cfg,
        vec![
            Command::UpsertFile { id: format!("{prefix}-x"), path: format!("{dir}/x.txt"), contents: s("from denorm"), previous_path: None },
            Command::UpsertPost { id: format!("{prefix}-p3"), user_id: user.clone(), title: s("Later"), body: s("after the rename"), previous_user_id: None },
        ]
        .into_iter()
        .map(|c| c.scoped(tenant))
        .collect(),
    );
    let search = |args: &[&str]| {
        let tenant: Vec<&str> = tenant.map_or(vec!["--default-tenant"], |t| vec!["--tenant", t]);
        r.run(&[&["search"], &tenant[..], args].concat())
    };
    assert_eq!(ours[0].0.partition as i64, partition_of(&dir), "denorm and the foreign producer chose different partitions for {dir}");
    assert_eq!(ours[1].0.partition as i64, partition_of(&user), "denorm and the foreign producer chose different partitions for {user}");
    wait_applied(&r.cfg, &r.group, 19);

    let (code, out, err) = search(&["files", "--under", &dir, "--json"]);
    assert_eq!(code, 0, "{err}");
    let mut files: Vec<(String, String)> =
        json_lines(&out).iter().map(|f| (f["id"].as_str().unwrap().to_string(), format!("{}/{}", f["path"].as_str().unwrap(), f["name"].as_str().unwrap()))).collect();
    files.sort();
    // f1 went to another top-level directory (an owner change in the
    // schema's previous_path form): there only.
    assert_eq!(files, vec![(format!("{prefix}-x"), format!("{dir}/x.txt"))]);
    let (code, out, err) = search(&["files", "--under", &format!("{dir}-b"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let moved: Vec<(String, String, String)> = json_lines(&out)
        .iter()
        .map(|f| (f["id"].as_str().unwrap().to_string(), format!("{}/{}", f["path"].as_str().unwrap(), f["name"].as_str().unwrap()), f["contents"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(moved, vec![(format!("{prefix}-f1"), format!("{dir}-b/a.txt"), s("moved"))]);

    // Every post of this scenario, with its author: the renamed user's name
    // is in p3 (sent after the rename), and p1 went to another user (an
    // owner change in the schema's previous_user_id form), with no copy
    // left under the first; p4 was sent after its user's delete, and has
    // no author name to copy.
    let (code, out, err) = search(&["posts", "--limit", "0", "--json"]);
    assert_eq!(code, 0, "{err}");
    let mut posts: Vec<(String, String, String)> = json_lines(&out)
        .iter()
        .filter(|p| p["id"].as_str().unwrap().starts_with(&format!("{prefix}-")))
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["user"]["id"].as_str().unwrap().to_string(), p["user"]["name"].as_str().unwrap().to_string()))
        .collect();
    posts.sort();
    assert_eq!(
        posts,
        vec![
            (format!("{prefix}-p1"), format!("{prefix}-u2"), format!("Grace {prefix}")),
            (format!("{prefix}-p3"), user.clone(), format!("Ada {prefix} After")),
            (format!("{prefix}-p4"), format!("{prefix}-u3"), String::new()),
        ]
    );
    let (_, metrics) = w.http_get("/metrics");
    assert_eq!(metric(&metrics, "denorm_dead_letters_total", &[]), 0.0, "{metrics}");
}

#[test]
fn a_python_producer_written_from_the_schemas_is_applied() {
    let r = Rig::new(6);
    let w = r.worker(&[]);
    let out = stdout_of(python().args(["produce", &r.cfg.brokers, &r.cfg.topic, "schemas", "py"]));
    // Tenant acme's (docs/tenants.md).
    assert_scenario_applied(&r, &w, "py", &out, Some("acme"));
}

/// Batches compressed by a producer denorm did not write (aiokafka, with
/// cramjam's codecs) are decompressed by the worker's librdkafka and
/// applied: a codec it lacks would stall the partition instead.
fn compressed_batches_of_python_are_applied(broker: Broker, codec: &str) {
    let r = Rig::on(broker, 6);
    let w = r.worker(&[]);
    let out = stdout_of(python().args(["produce", &r.cfg.brokers, &r.cfg.topic, "schemas", codec, codec]));
    assert_scenario_applied(&r, &w, codec, &out, Some("acme"));
}

#[test]
fn a_python_producers_zstd_batches_are_applied() {
    compressed_batches_of_python_are_applied(broker(), "zstd");
}

#[test]
fn a_python_producers_lz4_batches_are_applied() {
    compressed_batches_of_python_are_applied(broker(), "lz4");
}

#[test]
fn a_python_producers_gzip_batches_are_applied() {
    compressed_batches_of_python_are_applied(broker(), "gzip");
}

/// On noida-db's broker: tansu 0.6 cannot serve a snappy batch (its
/// fetch fails with `UnexpectedType("Snappy")` and drops the connection).
#[test]
fn a_python_producers_snappy_batches_are_applied() {
    compressed_batches_of_python_are_applied(Broker::noida(), "snappy");
}

/// A batch the consumer cannot fetch is fetched again for ever, and
/// librdkafka's error names no partition: tansu 0.6 fails every fetch of a
/// snappy batch. The worker reports that partition stalled (degraded in
/// `/readyz`, its gauge at 1, an error naming the offset); the partition
/// read to its end is not.
#[test]
fn a_partition_whose_batch_cannot_be_fetched_is_reported_stalled() {
    let r = Rig::new(2);
    let dir = |p: i32| (0..).map(|i| format!("/stall{i}")).find(|d| denorm::command::partitioner::partition_of(d, 2) == p).unwrap();
    let (stuck, fine) = (dir(0), dir(1));
    let file = |d: &str, id: &str| Command::UpsertFile { id: id.into(), path: format!("{d}/{id}.txt"), contents: s("x"), previous_path: None };
    let w = r.worker(&["--fetch-stall-secs", "2"]);
    let log = produce(&r.cfg, vec![file(&stuck, "a"), file(&fine, "b")]);
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    let line = format!("{stuck}\t{}\n", denorm::codec::Codec::new().encode(&Envelope::new(file(&stuck, "c"))).iter().map(|b| format!("{b:02x}")).collect::<String>());
    let lines = r.dir().join("snappy.tsv");
    std::fs::write(&lines, line).unwrap();
    stdout_of(python().args(["send-lines", &r.cfg.brokers, &r.cfg.topic]).arg(&lines).arg("snappy"));
    let body = wait_ready_status(&w, "503");
    assert!(body.contains("degraded"), "{body}");
    assert_eq!(w.metric("denorm_partition_fetch_stalled", &[("partition", "0")]), 1.0, "{}", w.log());
    assert_eq!(w.metric("denorm_partition_fetch_stalled", &[("partition", "1")]), 0.0, "the partition read to its end is not stalled");
    assert!(w.log().contains("the consumer reads nothing of this partition"), "{}", w.log());
}

#[test]
fn a_javascript_producer_written_from_the_schemas_is_applied() {
    let r = Rig::new(6);
    let w = r.worker(&[]);
    let out = stdout_of(node().args(["produce", &r.cfg.brokers, &r.cfg.topic, "schemas", "js"]));
    assert_scenario_applied(&r, &w, "js", &out, None);
}

#[test]
fn messages_of_javas_reference_encoder_are_applied() {
    let r = Rig::new(6);
    let w = r.worker(&[]);
    let lines = stdout_of(java().args(["encode", "schemas", "java"]));
    let file = r.dir().join("java-messages.tsv");
    std::fs::write(&file, &lines).unwrap();
    // BinaryMessageEncoder's own framing: C3 01 and the spec fingerprint.
    assert!(lines.lines().all(|l| l.split('\t').nth(1).unwrap().starts_with("c3018011b193097fef1b")), "{lines}");
    let out = stdout_of(python().args(["send-lines", &r.cfg.brokers, &r.cfg.topic]).arg(&file));
    assert_scenario_applied(&r, &w, "java", &out, None);
}

#[test]
fn messages_of_denorms_producer_decode_in_python() {
    let r = Rig::new(3);
    let commands = vec![
        Command::UpsertFile { id: s("f1"), path: s("/docs/ü/a b.txt"), contents: s("héllo"), previous_path: None },
        Command::DeleteFile { id: s("f1"), path: s("/docs/ü/a b.txt") },
        Command::UpsertFile { id: s("f1"), path: s("/other/a.txt"), contents: s("x"), previous_path: Some(s("/docs/ü/a b.txt")) },
        Command::RenamePath { from: s("/docs/a"), to: s("/docs/b") },
        Command::UpsertUser { id: s("u1"), name: s("Zoë"), email: s("z@example.com"), dob: s("2000-02-29") },
        Command::UpsertPost { id: s("p1"), user_id: s("u1"), title: s("T"), body: s("B"), previous_user_id: None },
        Command::DeletePost { id: s("p1"), user_id: s("u1") },
        Command::UpsertPost { id: s("p1"), user_id: s("u2"), title: s("T"), body: s("B"), previous_user_id: Some(s("u1")) },
        Command::DeleteUser { id: s("u1") },
    ];
    let sent: Vec<Envelope> = commands
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let mut e = Envelope::new(c).of_tenant((i % 2 == 0).then_some("acme"));
            if e.command.previous_key().is_some() {
                e.after = Some(denorm::command::LogPosition { partition: 2, offset: (1 << 33) + i as i64 });
            }
            // A repair (`denorm verify --repair`) on every other repairable one.
            if i % 2 == 0 && denorm::apply::repairable(&e.command) {
                let seen = [Some(true), Some(false), None][i / 2 % 3];
                e.repair = Some(denorm::command::Repair { unchanged_since: (1 << 34) + i as i64, seen });
            }
            e
        })
        .collect();
    rt().block_on(async {
        let p = Producer::new(&r.cfg).unwrap();
        for e in &sent {
            p.send_envelope(e).await.unwrap();
        }
    });
    let out = stdout_of(python().args(["decode", &r.cfg.brokers, &r.cfg.topic, "schemas", &sent.len().to_string()]));
    let got = json_lines(&out);
    assert_eq!(got.len(), sent.len());
    for e in &sent {
        let d = got.iter().find(|d| d["command_id"] == e.command_id.as_str()).unwrap_or_else(|| panic!("{} not decoded:\n{out}", e.command_id));
        assert_eq!(d["key"], e.command.key());
        assert_eq!(d["issued_at"].as_i64(), Some(e.issued_at));
        assert_eq!(d["tenant"].as_str(), e.tenant.as_deref());
        let after = e.after.map(|a| serde_json::json!({"partition": a.partition, "offset": a.offset}));
        assert_eq!(d["after"], after.unwrap_or_default(), "{d}");
        let repair = e.repair.map(|r| serde_json::json!({"unchanged_since": r.unchanged_since, "seen": r.seen}));
        assert_eq!(d["repair"], repair.unwrap_or_default(), "{d}");
        // The payload as fastavro read it, against the command as JSONL
        // spells it (field names are the schema's).
        let mut ours = serde_json::to_value(e.command.unscoped()).unwrap();
        ours.as_object_mut().unwrap().remove("op");
        // JSONL leaves an absent optional field out; Avro reads it as null.
        for (field, op) in [("previous_user_id", "upsert_post"), ("previous_path", "upsert_file")] {
            if e.command.kind() == op && ours.get(field).is_none() {
                ours[field] = serde_json::Value::Null;
            }
        }
        assert_eq!(d["payload"], ours, "{}", d);
        assert_eq!(d["type"], format!("denorm.{}", denorm::codec::record_name(&e.command)));
    }
}

#[test]
fn a_models_commands_pass_between_fastavro_and_denorm_both_ways() {
    a_models_commands_pass_both_ways(|| python_script("model_commands.py"));
}

#[test]
fn a_models_commands_pass_between_avsc_and_denorm_both_ways() {
    a_models_commands_pass_both_ways(|| node_script("model_commands.js"));
}

/// A model's commands (models/shop.jsonl) through another Avro library,
/// with the schema `denorm schema --model` prints and nothing else:
/// written by it, they decode in denorm as the same commands; written by
/// denorm, it reads them back as the same JSONL lines. `script` runs
/// `model_commands.* encode|decode SCHEMA`.
fn a_models_commands_pass_both_ways(script: impl Fn() -> Proc) {
    use denorm::codec::model::ModelCodec;
    use denorm::command::generic::jsonl;
    use denorm::domain::Domain;
    use std::io::Write;
    use std::process::Stdio;

    let schema = tempfile::NamedTempFile::new().unwrap();
    let printed = stdout_of(denorm().args(["schema", "--model", "models/shop.toml"]).current_dir(repo()));
    std::fs::write(schema.path(), &printed).unwrap();
    let codec = ModelCodec::new(Domain::load(&repo().join("models/shop.toml")).unwrap());
    assert_eq!(printed, codec.schema_text());
    let lines = std::fs::read_to_string(repo().join("models/shop.jsonl")).unwrap();
    let expected = jsonl::parse_all(codec.domain(), lines.as_bytes()).unwrap();
    let through = |action: &str, input: String| {
        let mut child = script().args([action]).arg(schema.path()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?} {action} failed:\n{}", script().get_args().collect::<Vec<_>>(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };

    let written = through("encode", lines.clone());
    let decoded: Vec<_> = written.lines().map(|hex| codec.decode(&(0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect::<Vec<_>>()).unwrap()).collect();
    assert_eq!(decoded.len(), expected.len());
    for (got, want) in decoded.iter().zip(&expected) {
        assert_eq!((&got.command, &got.tenant), (&want.command, &want.tenant));
        got.validate(codec.domain()).unwrap();
    }

    let ours: String = expected.iter().map(|e| codec.encode(e).iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n").collect();
    let read = through("decode", ours);
    let back = jsonl::parse_all(codec.domain(), read.as_bytes()).unwrap();
    assert_eq!(back.iter().map(|e| (&e.command, &e.tenant)).collect::<Vec<_>>(), expected.iter().map(|e| (&e.command, &e.tenant)).collect::<Vec<_>>());
}

/// A Python producer of the shop model, written from the model file and
/// the schema `denorm schema --model` prints (model_commands.py produce):
/// its keys are the ones the worker expects (no dead letter), its owner
/// change is the delete under the key it leaves, then the upsert naming
/// it, and `denorm run --model` indexes what every search of the fixture
/// finds.
#[test]
fn a_python_producer_of_a_model_is_applied_and_searched() {
    a_producer_of_a_model_is_applied_and_searched(python_script("model_commands.py"), "model_commands.py");
}

/// The same with avsc and kafkajs.
#[test]
fn a_javascript_producer_of_a_model_is_applied_and_searched() {
    a_producer_of_a_model_is_applied_and_searched(node_script("model_commands.js"), "model_commands.js");
}

fn a_producer_of_a_model_is_applied_and_searched(mut script: Proc, name: &str) {
    use crate::model_pipeline::{assert_shop_searched, shop_log, shop_log_messages, MODEL};
    use std::io::Write;
    use std::process::Stdio;

    let r = Rig::new(3);
    let worker = Worker::start(&r.cfg, &r.group, &r.index, &["--model", MODEL]);
    let schema = r.dir().join("shop.avsc");
    std::fs::write(&schema, stdout_of(denorm().args(["schema", "--model", MODEL]))).unwrap();
    let text = shop_log();
    let mut child =
        script.arg("produce").args([schema.as_os_str(), MODEL.as_ref()]).args([&r.cfg.brokers, &r.cfg.topic]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{name} produce failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let deliveries = json_lines(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(deliveries.len(), shop_log_messages(&text));
    // The product tree is keyed by its top segment, orders by their customer.
    assert!(deliveries.iter().any(|d| d["key"] == "/garden") && deliveries.iter().any(|d| d["key"] == "c1"), "{deliveries:?}");

    wait_applied_by(&r.cfg, &r.group, deliveries.len(), &[&worker]);
    assert_shop_searched(&r);
    let (_, metrics) = worker.http_get("/metrics");
    assert_eq!(metric(&metrics, "denorm_dead_letters_total", &[]), 0.0, "{metrics}");
}
