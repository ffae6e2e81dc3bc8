//! Command-line behaviour that needs no broker.

use std::process::Command;

fn denorm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_denorm"))
}

#[test]
fn help_never_shows_secrets_from_the_environment() {
    for args in [&["--help"][..], &["run", "--help"][..], &["produce", "--help"][..]] {
        let out = denorm().args(args).env("DENORM_KAFKA_OPTIONS", "sasl.password=hunter2").output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--kafka-option"), "{text}");
        assert!(!text.contains("hunter2"), "{args:?} shows the secret:\n{text}");
    }
}

/// A secret holding the options' separator is cut there; what is refused
/// is not echoed.
#[test]
fn an_option_cut_at_a_separator_is_refused_without_echoing_it() {
    let out = denorm().arg("lag").env("DENORM_KAFKA_OPTIONS", "sasl.password=first-half;second-half-of-the-secret").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected KEY=VALUE") && err.contains("--kafka-options-file"), "{err}");
    assert!(!err.contains("second-half") && !err.contains("first-half"), "the secret was echoed: {err}");
}

/// A filtered alias is no access boundary (a GET by id ignores its
/// filter): the help sends operators to document-level security.
#[test]
fn tenant_alias_help_recommends_document_level_security_not_alias_only_credentials() {
    let out = denorm().args(["tenant", "alias", "--help"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).replace('\n', " ").split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("document-level security"), "{text}");
    assert!(!text.contains("may read these aliases only"), "{text}");
}

#[test]
fn metrics_listener_defaults_to_loopback() {
    let out = denorm().args(["run", "--help"]).env_remove("DENORM_METRICS_ADDR").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[default: 127.0.0.1:9464]"), "{text}");
}

#[test]
fn usage_errors_exit_with_status_2() {
    assert_eq!(denorm().args(["produce", "rename", "--from", "/a/b"]).output().unwrap().status.code(), Some(2));
    assert_eq!(denorm().args(["nope"]).output().unwrap().status.code(), Some(2));
    assert_eq!(denorm().args(["-X", "no-equals-sign", "lag"]).output().unwrap().status.code(), Some(2));
}

/// `denorm model check`: the shipped models pass and show what they
/// declare; a bad one exits 2 naming its file, line and field.
#[test]
fn model_check_shows_a_shipped_model_and_names_a_bad_models_line() {
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let out = denorm().args(["model", "check"]).arg(models.join("shop.toml")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "model shop version 1 (4 kinds), fingerprint ",
        "order: keyed by its owner customer (customer_id)",
        "copies from customer through customer_id: customer.name, customer.plan",
        "nested list lines: price (float), quantity (integer), sku (keyword)",
        "product: keyed by the top segment of path",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    let out = denorm().args(["model", "check"]).arg(models.join("files-and-posts.toml")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("post: keyed by its owner user (user_id)"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\nversion = 1\n[kinds.a]\nkey = \"id\"\nfields.n = \"txt\"\n").unwrap();
    let out = denorm().args(["model", "check"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:5:12: kinds.a.fields.n: unknown type `txt`", bad.display())), "{err}");
}

/// `denorm schema`: the compiled-in schema as the repository has it, a
/// model's as the codec writes with it, their fingerprints, and a bad
/// model refused as `model check` refuses it.
#[test]
fn schema_prints_the_compiled_in_schema_or_a_models_and_their_fingerprints() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = |args: &[&str]| {
        let out = denorm().args(args).current_dir(repo).output().unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(run(&["schema"]), (Some(0), std::fs::read_to_string(repo.join("schemas/command.avsc")).unwrap(), String::new()));
    assert_eq!(run(&["schema", "--fingerprint"]).1.trim(), denorm::codec::Codec::new().current_fingerprint());
    let codec = denorm::codec::model::ModelCodec::new(denorm::domain::Domain::load(&repo.join("models/shop.toml")).unwrap());
    assert_eq!(run(&["schema", "--model", "models/shop.toml"]).1, codec.schema_text());
    assert_eq!(run(&["schema", "--model", "models/shop.toml", "--fingerprint"]).1.trim(), codec.fingerprint());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\nversion = 1\n[kinds.a]\nkey = \"id\"\nfields.n = \"txt\"\n").unwrap();
    let (code, out, err) = run(&["schema", "--model", bad.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert!(err.contains("5:12: kinds.a.fields.n: unknown type `txt`"), "{err}");
}

/// Issue 27 B6: a page size Elasticsearch refuses for every page of every
/// fan-out is refused at startup, before anything is contacted (the URL
/// below has no server).
#[test]
fn a_fan_out_page_above_elasticsearchs_result_window_is_refused_at_startup() {
    let out = denorm().args(["--brokers", "127.0.0.1:1", "--index", "http://127.0.0.1:1", "run", "--page-size", "10001"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--page-size 10001 is above Elasticsearch's index.max_result_window (10000)"), "{err}");
}

/// Review F11: a pause between a fan-out's pages that its point in time
/// cannot outlive is refused at startup on Elasticsearch (it made every
/// paged fan-out expire, restart and fail); the embedded index scans
/// without one and does not check it.
#[test]
fn a_pause_between_pages_longer_than_a_point_in_time_lives_is_refused_on_elasticsearch() {
    let out = denorm().args(["--brokers", "127.0.0.1:1", "--index", "http://127.0.0.1:1", "run", "--fan-out-page-pause-ms", "300000"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--fan-out-page-pause-ms 300000 is above 150000 ms"), "{err}");
}

/// Issue 43: a member number out of range, and verify members without the
/// run name they combine their verdicts by, are refused before anything is
/// contacted.
#[test]
fn members_flags_are_checked_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (vec!["rebuild", "--members", "2", "--member", "2"], "members are numbered 0 to 1"),
        (vec!["verify", "--members", "2", "--member", "1"], "--members above 1 needs --run"),
        (vec!["verify", "--members", "3", "--member", "3", "--run", "r"], "members are numbered 0 to 2"),
        (vec!["verify", "--sample", "10", "--sample-rotation", "weekly"], "expected a number or `daily`"),
        (vec!["verify", "--repair", "--max-repairs", "0"], "--max-repairs"),
    ] {
        let out = denorm().args(["--brokers", "127.0.0.1:1", "--index"]).arg(dir.path()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Seeds for the fuzzer (`fuzz/README.md`): valid messages of every command,
/// prefixed by their key length and key as the fuzz target expects. Written
/// to `DENORM_FUZZ_CORPUS` when it is set, to a scratch directory in the
/// suite; either way each seed must be admitted whole, split as the fuzz
/// target splits its input (a seed the target refuses would start the
/// fuzzer nowhere).
#[test]
fn write_fuzz_corpus() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = std::env::var("DENORM_FUZZ_CORPUS").map(std::path::PathBuf::from).unwrap_or_else(|_| scratch.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let codec = denorm::codec::Codec::new();
    // The seeds written (the directory may hold the fuzzer's own inputs).
    let mut written = Vec::new();
    let write = |name: String, bytes: Vec<u8>| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let mut commands = denorm::demo::seed(3, 2, 2, 1);
    commands.push(denorm::demo::race().0);
    commands.push(denorm::command::Command::DeletePost { id: "p".into(), user_id: "1".into() });
    commands.push(denorm::command::Command::DeleteFile { id: "f".into(), path: "/a/b".into() });
    for (i, c) in commands.into_iter().enumerate() {
        let key = c.key().as_bytes().to_vec();
        let mut bytes = vec![key.len() as u8];
        bytes.extend(&key);
        bytes.extend(codec.encode(&denorm::command::Envelope::new(c)));
        written.push(write(format!("seed{i}"), bytes));
    }
    // Control messages of `denorm dlq`, keyed like their letters.
    for (i, action) in [denorm::command::control::Action::Replay, denorm::command::control::Action::Resolve].into_iter().enumerate() {
        let c = denorm::command::control::Control {
            action,
            key: "/a".into(),
            dlq_partition: 0,
            dlq_offset: 3,
            through: 5,
            origin_offset: 7,
            payload: codec.encode(&denorm::command::Envelope::new(denorm::command::Command::DeleteFile { id: "f".into(), path: "/a/b".into() })),
            requested_at: 0,
            through_at: 7,
        };
        let mut bytes = vec![2u8, b'/', b'a'];
        bytes.extend(codec.encode_control(&c));
        written.push(write(format!("control{i}"), bytes));
    }
    // A chunk of a cross-key move, keyed by its destination.
    let chunk = denorm::command::moves::MoveIn {
        move_id: "m".into(),
        source_partition: 1,
        source_offset: 9,
        from: "/s/a".into(),
        to: "/d/a".into(),
        chunk: 0,
        last: true,
        issued_at: 0,
        files: vec![],
        aborted: false,
    };
    let mut bytes = vec![2u8, b'/', b'd'];
    bytes.extend(codec.encode_move(&chunk));
    written.push(write("move0".into(), bytes));
    // Each seed through the fuzz target's own checks, and admitted.
    for path in &written {
        assert!(denorm::worker::admit::fuzz_input(&codec, &std::fs::read(path).unwrap()), "seed {} is refused", path.display());
    }
    assert!(written.len() >= 11, "{} seeds", written.len());
    // The commands of both shipped models, each admitted by a worker of its
    // model: the shop's example log, and the compiled-in seeds read as
    // commands of files-and-posts.
    let model = |file: &str| denorm::domain::Domain::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join(file)).unwrap().interned();
    let (shop, files) = (model("shop.toml"), model("files-and-posts.toml"));
    let shop_log = denorm::command::generic::jsonl::parse_all(shop, include_str!("../../models/shop-example.jsonl").as_bytes()).unwrap();
    let legacy: Vec<_> = denorm::demo::seed(3, 2, 2, 1).into_iter().map(|c| denorm::command::generic::legacy::to_model(&denorm::command::Envelope::new(c))).collect();
    for (name, d, log) in [("shop", shop, shop_log), ("files-and-posts", files, legacy)] {
        let codec = denorm::codec::Codec::new().with_model(d);
        assert!(log.len() >= 5, "{name}: {} commands", log.len());
        for (i, e) in log.into_iter().enumerate() {
            let envelope = denorm::command::generic::bound::Bound::envelope(d, e);
            let key = envelope.command.key().as_bytes().to_vec();
            let mut bytes = vec![key.len() as u8];
            bytes.extend(&key);
            bytes.extend(codec.encode(&envelope));
            let path = write(format!("{name}{i}"), bytes);
            assert!(denorm::worker::admit::fuzz_input(&codec, &std::fs::read(&path).unwrap()), "seed {} is refused by a worker of model {name}", path.display());
            // A worker without the model does not take it.
            assert!(!denorm::worker::admit::fuzz_input(&denorm::codec::Codec::new(), &std::fs::read(&path).unwrap()), "seed {} is admitted without its model", path.display());
        }
    }
}
