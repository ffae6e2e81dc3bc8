//! `denorm rebuild --model` on a real broker, with a live worker: a
//! rebuild with the index's own model cuts over and the worker follows;
//! a rebuild into another version of the model is refused unless asked
//! (`--change-model`), and once cut over, the old model's worker stops and
//! the new model's applies, searches and verifies.

use std::time::Duration;

use crate::common::*;
use crate::model_pipeline::{assert_shop_searched, shop_log, shop_log_messages, with_model, MODEL, SHOP_V2};
use crate::rebuild::generations_of;

/// Version 2 of the shop model (`tests/fixtures/shop-v2.toml`): orders
/// gain an optional sales channel, and a kind of its own holds suppliers.
/// It reads the commands of version 1 (`models/shop.toml`) when it names
/// it under `earlier`.
fn shop_v2(earlier: bool) -> String {
    let v2 = std::fs::read_to_string(SHOP_V2).unwrap();
    match earlier {
        true => v2.replace("\"../../models/shop.toml\"", &format!("{MODEL:?}")),
        false => v2.replace("earlier = [\"../../models/shop.toml\"]\n", ""),
    }
}

/// `denorm` with the model file `model`, on the rig's broker, group and
/// index.
fn with(r: &Rig, model: &std::path::Path, args: &[&str]) -> std::process::Command {
    let mut c = cli(&r.cfg, &r.group, &r.index);
    c.arg("--model").arg(model).args(args);
    c
}

/// `produce --jsonl` of `lines` with the model file `model`.
fn produce_lines(r: &Rig, model: &std::path::Path, name: &str, lines: &[&str]) {
    let file = r.dir().join(name);
    std::fs::write(&file, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let (code, out, err) = output(with(r, model, &["produce", "--wait", "120", "--jsonl"]).arg(&file));
    assert_eq!((code, &json_lines(&out)[0]["produced"]), (0, &serde_json::json!(lines.len())), "{out}\n{err}");
}

/// The ids `search` finds.
fn found(r: &Rig, model: &std::path::Path, args: &[&str]) -> Vec<String> {
    let (code, out, err) = output(&mut with(r, model, &[&["search"], args, &["--limit", "0"]].concat()));
    assert_eq!(code, 0, "{args:?}: {err}");
    out.lines().map(str::to_string).collect()
}

/// `verify --json` with the model file `model`: its exit code, report
/// and stderr.
fn verified(r: &Rig, model: &std::path::Path) -> (i32, serde_json::Value, String) {
    let (code, out, err) = output(&mut with(r, model, &["verify", "--json"]));
    (code, serde_json::from_str(&out).unwrap_or(serde_json::Value::Null), err)
}

/// The version of the model generation `g` holds, as `rebuild --status`
/// shows it.
fn held_by(r: &Rig, g: u64) -> serde_json::Value {
    let (code, out, err) = r.run(&["rebuild", "--status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["models"][g.to_string()]["name"], "shop", "{status}");
    status["models"][g.to_string()]["version"].clone()
}

/// The index names under this process's prefix on the rig's server, or
/// the generations of the embedded index.
fn stored(r: &Rig) -> Vec<String> {
    if r.is_elastic() {
        return elastic::indexes(&r.index.to_string_lossy());
    }
    let rt = rt();
    generations_of(r, &rt).list().unwrap().iter().map(u64::to_string).collect()
}

fn a_models_index_is_rebuilt_and_its_model_changed(r: Rig) {
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let v1 = std::path::Path::new(MODEL);
    let log = r.dir().join("shop.jsonl");
    let text = shop_log();
    std::fs::write(&log, &text).unwrap();
    let mut sent = shop_log_messages(&text);
    let worker = Worker::start(cfg, group, index, &["--model", MODEL]);
    let (code, _, err) = output(with_model(&r, &["produce", "--wait", "120", "--jsonl"]).arg(&log));
    assert_eq!(code, 0, "{err}");
    wait_applied_by(cfg, group, sent, &[&worker]);
    let rt = rt();
    let generations = generations_of(&r, &rt);

    // The same model: the new generation is compared with the live one,
    // cut over to, and the live worker follows it.
    let (code, out, err) = output(&mut with_model(&r, &["rebuild", "--verify", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(": equal"), "{out}");
    assert_eq!(generations.current().unwrap(), 1);
    assert_eq!(held_by(&r, 1), serde_json::json!(1), "rebuild --status names the model of generation 1");
    assert_shop_searched(&r);
    produce_lines(&r, v1, "late.jsonl", &[r#"{"op":"upsert","kind":"order","id":"o10","fields":{"customer_id":"c1","placed":"2026-12-02","status":"new","total":3}}"#]);
    sent += 1;
    wait_applied_by(cfg, group, sent, &[&worker]);
    assert!(found(&r, v1, &["order", "--term", "status=new"]).contains(&"o10".to_string()), "{}", worker.log());
    let (code, report, err) = verified(&r, v1);
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{report}\n{err}");

    // Version 2: refused without --change-model, with --verify, which
    // compares documents of one model, and when it does not read version
    // 1's commands; then built and cut over to.
    let v2 = r.dir().join("shop-v2.toml");
    std::fs::write(&v2, shop_v2(false)).unwrap();
    let (code, _, err) = output(&mut with(&r, &v2, &["rebuild", "--change-model", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("reads none of version 1") && err.contains("`earlier`"), "{err}");
    std::fs::write(&v2, shop_v2(true)).unwrap();
    let (code, out, err) = output(denorm().args(["model", "check"]).arg(&v2));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("model shop version 2 (5 kinds)") && out.contains("reads the commands of version 1 too"), "{out}");
    let rebuild_v2 = |extra: &[&str]| output(&mut with(&r, &v2, &[&["rebuild", "--metrics-addr", "127.0.0.1:0"], extra].concat()));
    let (code, _, err) = rebuild_v2(&[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds model shop version 1") && err.contains("model shop version 2") && err.contains("--change-model"), "{err}");
    let (code, _, err) = rebuild_v2(&["--change-model", "--verify"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("denorm verify --model"), "{err}");
    assert_eq!(generations.current().unwrap(), 1, "nothing cut over");
    let (code, out, err) = rebuild_v2(&["--change-model"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("changing the model"), "{err}");
    assert_eq!(generations.current().unwrap(), 2);
    assert_eq!(held_by(&r, 2), serde_json::json!(2));

    // The worker of version 1 stops, naming the models; one of version 2
    // takes the log on.
    let (status, log) = worker.wait_exit(Duration::from_secs(120));
    assert!(!status.success(), "{log}");
    assert!(log.contains("holds model shop version 2") && log.contains("--change-model"), "{log}");
    let worker = Worker::start(cfg, group, index, &["--model", v2.to_str().unwrap()]);
    produce_lines(
        &r,
        &v2,
        "v2.jsonl",
        &[
            r#"{"op":"upsert","kind":"supplier","id":"s1","fields":{"name":"Acme tools"}}"#,
            r#"{"op":"upsert","kind":"order","id":"o11","fields":{"customer_id":"c2","placed":"2026-12-03","status":"new","total":4,"channel":"web"}}"#,
        ],
    );
    sent += 2;
    wait_applied_by(cfg, group, sent, &[&worker]);
    assert_eq!(found(&r, &v2, &["order", "--term", "channel=web"]), ["o11"], "{}", worker.log());
    assert_eq!(found(&r, &v2, &["supplier"]), ["s1"]);
    assert_eq!(found(&r, &v2, &["order", "--term", "customer_id=c4"]), ["o9"], "the owner change replayed into version 2");
    let (code, out, _) = output(&mut with(&r, &v2, &["search", "order", "--term", "channel=web", "--json"]));
    assert_eq!((code, &json_lines(&out)[0]["customer"]["name"]), (0, &serde_json::json!("Bo Ek")), "the copy of its customer: {out}");
    let (code, report, err) = verified(&r, &v2);
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{report}\n{err}");
    let (code, _, err) = verified(&r, v1);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds model shop version 2"), "{err}");
    assert!(worker.terminate().success());

    // The generations of version 1 are gone, every kind of them.
    let left = stored(&r);
    if r.is_elastic() {
        assert!(left.iter().any(|i| i.ends_with("-supplier-000003")), "{left:?}");
        assert!(!left.iter().any(|i| i.ends_with("-000001") || i.ends_with("-000002")), "{left:?}");
    } else {
        assert_eq!(left, ["2"]);
    }
}

#[test]
fn a_models_index_is_rebuilt_and_its_model_changed_on_the_embedded_index() {
    a_models_index_is_rebuilt_and_its_model_changed(Rig::new(3));
}

#[test]
fn a_models_index_is_rebuilt_and_its_model_changed_on_elasticsearch() {
    let _es = elastic::elastic();
    a_models_index_is_rebuilt_and_its_model_changed(Rig::elastic(3));
}
