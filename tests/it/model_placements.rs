//! A declared model's tenants in indexes of their own on Elasticsearch
//! (the suite's noida-db): a tenant named in `DENORM_ES_DEDICATED_TENANTS`
//! has its own index of every kind of the model, searched, verified and
//! rebuilt alone as the compiled-in kinds' are, and `denorm rebuild
//! --tenant` moves a tenant between the shared indexes and its own.

use std::ffi::OsStr;

use crate::common::*;
use crate::model_pipeline::{assert_shop_searched_as, shop_log, shop_log_messages, with_model, MODEL};
use crate::placements::{corrupt_own, count_of, shown_through, DEDICATED};

/// [`shop_log`] as `tenant`'s commands.
fn tenants_log(tenant: &str) -> String {
    shop_log()
        .lines()
        .map(|line| {
            let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
            v["tenant"] = tenant.into();
            format!("{v}\n")
        })
        .collect()
}

/// The ids a search of the shop model gives: `scope` (`--tenant T`,
/// `--default-tenant`) and `args` after `search`.
fn ids(r: &Rig, scope: &[&str], args: &[&str]) -> Vec<String> {
    let all: Vec<&str> = ["search"].into_iter().chain(scope.iter().copied()).chain(args.iter().copied()).chain(["--limit", "0"]).collect();
    let (code, out, err) = output(&mut with_model(r, &all));
    assert_eq!(code, 0, "{all:?}: {err}");
    out.lines().map(String::from).collect()
}

/// `denorm verify --model` is clean, of `args`' scope.
fn verify_is_clean(r: &Rig, args: &[&str]) -> u64 {
    let all: Vec<&str> = ["verify", "--json"].into_iter().chain(args.iter().copied()).collect();
    let (code, out, err) = output(&mut with_model(r, &all));
    let report = report_of(code, &out, &err);
    assert_eq!((code, &report["differences_total"]), (0, &serde_json::json!(0)), "{all:?}: {report}");
    report["checked"].as_u64().unwrap()
}

/// `denorm rebuild --tenant` with the model, `dedicated` configured.
fn rebuild_tenant(r: &Rig, dedicated: &str, args: &[&str]) -> (i32, String, String) {
    output(with_model(r, &["rebuild", "--metrics-addr", "127.0.0.1:0", "--tenant"]).args(args).env(DEDICATED, dedicated))
}

/// acme in indexes of its own from the first generation, globex and the
/// default tenant shared, each with the shop log: every search of the
/// model gives each tenant its own documents, acme's are in its own index
/// of each kind and only there, its aliases show them, and verify is
/// clean. An order of acme changed behind the pipeline's back is found by
/// verify and put right by `rebuild --tenant acme`, after which the live
/// worker applies acme's profile change to the rebuilt revision. Then
/// globex moves into indexes of its own and acme into the shared ones,
/// each by a rebuild of that tenant alone, and every tenant is searched
/// as before.
#[test]
fn a_models_tenant_has_its_own_indexes_is_rebuilt_alone_and_moves_between_placements_on_elasticsearch() {
    let _es = crate::common::elastic::elastic();
    let r = Rig::elastic(3);
    let (url, prefix) = (r.index.display().to_string(), crate::common::elastic::prefix());
    let worker = Worker::start_env(&r.cfg, &r.group, &r.index, &["--model", MODEL], &[(DEDICATED, OsStr::new("acme"))]);
    let log = r.dir().join("tenants.jsonl");
    let text = [shop_log(), tenants_log("acme"), tenants_log("globex")].concat();
    std::fs::write(&log, &text).unwrap();
    let (code, out, err) = output(with_model(&r, &["produce", "--wait", "120", "--jsonl"]).arg(&log));
    assert_eq!(code, 0, "{err}\n{}", worker.log());
    assert_eq!(json_lines(&out)[0]["produced"], 3 * shop_log_messages(&shop_log()) as i64, "{out}");

    let tenants: [(&str, &[&str]); 3] = [("default", &["--default-tenant"]), ("acme", &["--tenant", "acme"]), ("globex", &["--tenant", "globex"])];
    let each_tenant_searched = |when: &str| {
        for (name, scope) in tenants {
            eprintln!("{when}: searching as {name}");
            assert_shop_searched_as(&r, scope);
        }
    };
    each_tenant_searched("acme in its own indexes");
    let orders = ids(&r, &["--default-tenant"], &["order"]).len();
    assert!(orders >= 2, "{orders}");
    // acme's documents of every kind of the model are in its own indexes,
    // and only there; globex's are in the shared ones.
    for kind in ["customer", "order", "ticket", "product"] {
        let n = ids(&r, &["--default-tenant"], &[kind]).len();
        assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-{kind}"), "acme"), n, "{kind}");
        assert!(count_of(&url, &format!("{prefix}-t-acme-{kind}-000001"), "acme").is_some_and(|c| c >= n as u64), "{kind}");
        assert_eq!(count_of(&url, &format!("{prefix}-{kind}-000001"), "acme"), Some(0), "{kind}: acme is not in the shared index");
        assert_eq!(count_of(&url, &format!("{prefix}-t-globex-{kind}-000001"), "globex"), None, "{kind}: globex is shared");
    }
    let (code, out, err) = r.run(&["tenant", "alias", "acme"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == format!("{prefix}-t-acme-order")), "tenant alias names the model's kinds too: {out}");
    let (code, out, err) = r.run(&["tenant", "alias", "globex"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == format!("{prefix}-t-globex-order")), "{out}");
    assert_eq!(shown_through(&url, &format!("{prefix}-t-globex-order"), "globex"), orders, "globex's filtered alias on the shared index of orders");
    let all = verify_is_clean(&r, &[]);
    assert_eq!(verify_is_clean(&r, &["--tenant", "acme"]) * 3, all);

    // An order of acme changed behind the pipeline's back: found, and put
    // right by a rebuild of acme alone.
    let acme_orders = format!("{prefix}-t-acme-order");
    corrupt_own(&r, ("acme", "order"), "o1", serde_json::json!({"status": "lost"}));
    let (code, out, err) = output(&mut with_model(&r, &["verify", "--json", "--tenant", "acme"]));
    let report = report_of(code, &out, &err);
    assert_eq!((code, &report["differences"][0]["id"]), (1, &serde_json::json!("o1")), "{report}");
    let (code, _, err) = output(cli(&r.cfg, &r.group, &r.index).args(["rebuild", "--metrics-addr", "127.0.0.1:0", "--tenant", "acme"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("holds model shop") && err.contains("run it with that model's --model"), "a tenant's rebuild keeps the generation's model: {err}");
    let (code, _, err) = rebuild_tenant(&r, "acme", &["acme"]);
    assert_eq!(code, 0, "{err}\n{}", worker.log());
    assert_eq!(ids(&r, &["--tenant", "acme"], &["order", "--term", "status=lost"]), Vec::<String>::new());
    assert_eq!(verify_is_clean(&r, &["--tenant", "acme"]) * 3, all);
    assert!(count_of(&url, &format!("{prefix}-t-acme-order-000001-r1"), "acme").is_some(), "the rebuilt revision");
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-order-000001"), "acme"), None, "the old revision deleted");
    // The live worker writes the rebuilt revision.
    let patch = r.dir().join("patch.jsonl");
    std::fs::write(&patch, r#"{"op":"patch","kind":"customer","id":"c2","set":{"name":"Bo Lund"},"tenant":"acme"}"#).unwrap();
    let (code, _, err) = output(with_model(&r, &["produce", "--wait", "120", "--jsonl"]).arg(&patch));
    assert_eq!(code, 0, "{err}\n{}", worker.log());
    let of_c2 = ids(&r, &["--tenant", "acme"], &["order", "--term", "customer_id=c2"]);
    assert!(!of_c2.is_empty());
    assert_eq!(ids(&r, &["--tenant", "acme"], &["order", "--term", "customer.name.raw=Bo Lund"]), of_c2, "the copies rewritten in acme's rebuilt indexes");
    assert_eq!(ids(&r, &["--tenant", "globex"], &["order", "--term", "customer.name.raw=Bo Lund"]), Vec::<String>::new());
    assert_eq!(shown_through(&url, &acme_orders, "acme"), orders);
    std::fs::write(&patch, r#"{"op":"patch","kind":"customer","id":"c2","set":{"name":"Bo Ek"},"tenant":"acme"}"#).unwrap();
    let (code, _, err) = output(with_model(&r, &["produce", "--wait", "120", "--jsonl"]).arg(&patch));
    assert_eq!(code, 0, "{err}");

    // globex moves into indexes of its own, acme into the shared ones.
    let (code, _, err) = rebuild_tenant(&r, "acme,globex", &["globex"]);
    assert_eq!(code, 0, "{err}\n{}", worker.log());
    assert_eq!(shown_through(&url, &format!("{prefix}-t-globex-order-000001-r1"), "globex"), orders, "globex's own index of orders");
    assert_eq!(shown_through(&url, &format!("{prefix}-t-globex-order"), "globex"), orders);
    let (code, _, err) = rebuild_tenant(&r, "globex", &["acme", "--to-shared"]);
    assert_eq!(code, 0, "{err}\n{}", worker.log());
    assert_eq!(count_of(&url, &format!("{prefix}-t-acme-order-000001-r1"), "acme"), None, "acme's own indexes deleted");
    assert_eq!(shown_through(&url, &format!("{prefix}-t-acme-order"), "acme"), orders, "acme's alias reads it in the shared index");
    each_tenant_searched("globex in its own indexes, acme shared");
    assert_eq!(verify_is_clean(&r, &[]), all);
    assert!(worker.terminate().success());
}
