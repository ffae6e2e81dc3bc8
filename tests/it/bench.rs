//! The benchmark at smoke size (the full sizes run from scripts/bench.sh):
//! every phase runs against the test broker and reports consistent figures.

use crate::common::*;

/// Runs `denorm bench` on the test broker with `args`, its work under
/// `dir`; checks that it succeeds and prints each of `rows`, and returns
/// the results it wrote.
fn bench(dir: &std::path::Path, args: &[&str], rows: &[&str]) -> serde_json::Value {
    let broker = broker();
    let out = dir.join("bench.json");
    let (code, stdout, stderr) = output(denorm().args(["--brokers", &broker.brokers, "bench"]).args(args).arg("--out").arg(&out).arg("--dir").arg(dir.join("work")));
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    println!("{stdout}");
    for row in rows {
        assert!(stdout.contains(row), "no {row:?} in\n{stdout}");
    }
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

#[test]
fn bench_smoke_runs_every_phase_and_writes_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench(
        dir.path(),
        &[
            "--docs",
            "3000",
            "--renames",
            "2000,5000",
            "--latency-rate",
            "200",
            "--latency-secs",
            "2",
            "--read-your-writes",
            "40",
            "--head-of-line-files",
            "20000",
            "--head-of-line-rate",
            "100",
            "--key-concurrency-commands",
            "500",
            "--key-concurrency-keys",
            "1,100",
            "--profile-users",
            "100",
            "--tenant-flood-commands",
            "2000",
        ],
        &[
            "replay of 3000 commands",
            "3000 single-document updates",
            "100 profile changes (5 posts each)",
            "mixed log of 2100 commands",
            "rename of a directory of 5000 files",
            "produce -> searchable at 200/s",
            "head of line: another key at 100/s during a rename of 20000 files",
            "re-application after a rebalance during a rename of 20000 files",
            "key concurrency: 500 single-document commands over 100 key(s)",
            "verify of ",
            "tenant fairness: a quiet tenant at 100/s while a noisy tenant's backlog of 2000 commands drains",
            "tenant fairness, log order only (--tenant-read-ahead false)",
            "tenant fairness, the broker's part: the same produced with no worker",
            "tenant fairness against what the broker allows",
        ],
    );
    let r = &v["results"];
    let positive = |x: &serde_json::Value, what: &str| {
        let f = x.as_f64().unwrap_or_else(|| panic!("{what} missing in {r:#}"));
        assert!(f.is_finite() && f > 0.0, "{what} = {f}");
        f
    };
    assert_eq!(r["replay"]["commands"], 3000);
    for phase in ["replay", "single_document", "rename_2000", "rename_5000"] {
        let rate = positive(&r[phase]["rate"], &format!("{phase}.rate"));
        let ratio = positive(&r[phase]["ratio"], &format!("{phase}.ratio"));
        // The ratio is the rate over the baseline measured in the same run.
        let baseline = match phase {
            "replay" => positive(&r[phase]["raw_consume_rate"], "consume").min(positive(&r[phase]["raw_index_rate"], "index")),
            "single_document" => positive(&r[phase]["raw_consume_rate"], "consume"),
            _ => positive(&r[phase]["raw_rate"], "raw rename"),
        };
        assert!((ratio - rate / baseline).abs() < 1e-9, "{phase}: {ratio} != {rate} / {baseline}");
    }
    profiles_measured(r, 100, &positive);
    positive(&r["rename_5000"]["worker_peak_rss_kb"], "peak memory");
    // The largest tree then moved to another top-level directory, against
    // the rename within its tree.
    let (rate, ratio) = (positive(&r["move_5000"]["rate"], "move rate"), positive(&r["move_5000"]["ratio"], "move ratio"));
    assert!((ratio - rate / positive(&r["rename_5000"]["rate"], "rename rate")).abs() < 1e-9);
    assert_eq!(r["rename_memory"]["large"], 5000);
    // Every probe of the latency phase became searchable and was measured.
    assert_eq!(r["latency"]["commands"], 400);
    assert_eq!(r["read_your_writes"]["commands"], 40, "--read-your-writes");
    let (p50, p99) = (positive(&r["latency"]["p50_ms"], "p50"), positive(&r["latency"]["p99_ms"], "p99"));
    assert!(p50 <= p99, "p50 {p50} > p99 {p99}");
    head_of_line_measured(r);
    key_concurrency_measured(r);
    tenant_flood_measured(r, 2000);
    // The files of the phases above, and the profile phases' users, posts
    // and files.
    verify_measured(r, 3000 + 2000 + 5000 + 100 * 6 + 100 * 20);
    // The documents the benchmark wrote are in its index.
    let search = |under: &str| output(denorm().args(["search", "files", "--under", under, "--limit", "0"]).arg("--index").arg(dir.path().join("work/index")));
    let (code, files, _) = search("/x5000/moved");
    assert_eq!(code, 0);
    assert_eq!(files.lines().count(), 5000);
    assert!(files.lines().all(|l| l.starts_with("/x5000/moved/d")), "{files}");
    assert_eq!(search("/r5000").1, "", "nothing left at the source");
}

/// `denorm bench --elasticsearch` at smoke size on the Elasticsearch-API
/// server of the suite: every phase runs beside its baseline (a plain
/// `_bulk`, `_update_by_query`), the ratios are the rates over those
/// baselines, and the renamed tree is where the rename put it.
#[test]
fn bench_smoke_on_elasticsearch_runs_every_phase_beside_bulk_and_update_by_query() {
    let es = crate::common::elastic::elastic();
    let dir = tempfile::tempdir().unwrap();
    let v = bench(
        dir.path(),
        &[
            "--elasticsearch",
            &es.url,
            "--skip-verify",
            "--docs",
            "2000",
            "--renames",
            "1000,3000",
            "--latency-rate",
            "100",
            "--latency-secs",
            "2",
            "--read-your-writes",
            "40",
            "--head-of-line-files",
            "5000",
            "--head-of-line-rate",
            "100",
            "--key-concurrency-commands",
            "500",
            "--key-concurrency-keys",
            "1,100",
            "--profile-users",
            "40",
            "--tenant-flood-commands",
            "1000",
        ],
        &[
            "replay of 2000 commands",
            "2000 single-document updates",
            "40 profile changes (5 posts each)",
            "mixed log of 840 commands",
            "rename of a directory of 3000 files",
            "_update_by_query",
            "plain _bulk",
            "produce -> searchable at 100/s",
            "head of line: another key at 100/s during a rename of 5000 files",
            "re-application after a rebalance during a rename of 5000 files",
            "key concurrency: 500 single-document commands over 100 key(s)",
            "tenant fairness: a quiet tenant at 100/s while a noisy tenant's backlog of 1000 commands drains",
            "tenant fairness, log order only (--tenant-read-ahead false)",
            "tenant fairness, the broker's part: the same produced with no worker",
            "tenant fairness against what the broker allows",
        ],
    );
    let r = &v["results"];
    let positive = |x: &serde_json::Value, what: &str| {
        let f = x.as_f64().unwrap_or_else(|| panic!("{what} missing in {r:#}"));
        assert!(f.is_finite() && f > 0.0, "{what} = {f}");
        f
    };
    assert!(r.get("verify").is_none(), "--skip-verify skips the phase: {r:#}");
    for (phase, baseline) in [("replay", "raw_bulk_rate"), ("single_document", "raw_bulk_rate"), ("rename_1000", "raw_rate"), ("rename_3000", "raw_rate")] {
        let (rate, ratio, base) = (positive(&r[phase]["rate"], "rate"), positive(&r[phase]["ratio"], "ratio"), positive(&r[phase][baseline], baseline));
        assert!((ratio - rate / base).abs() < 1e-9, "{phase}: {ratio} != {rate} / {base}");
    }
    profiles_measured(r, 40, &positive);
    assert_eq!(r["latency"]["commands"], 200);
    head_of_line_measured(r);
    key_concurrency_measured(r);
    tenant_flood_measured(r, 1000);
    // The renamed tree, through denorm's own search of the run's indexes.
    let prefix = v["index_prefix"].as_str().expect("the run's index prefix");
    crate::common::elastic::remove_when_done(prefix);
    let (code, files, err) = output(denorm().env("DENORM_ES_PREFIX", prefix).args(["search", "files", "--under", "/r3000", "--limit", "0", "--index", &es.url]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(files.lines().count(), 3000);
    assert!(files.lines().all(|l| l.starts_with("/r3000/moved/d")), "{files}");
}

/// The tenant-fairness phase measured the quiet tenant alone and during
/// the noisy tenant's backlog of `n` commands, beside each other.
fn tenant_flood_measured(r: &serde_json::Value, n: u64) {
    let t = &r["tenant_flood"];
    assert_eq!(t["backlog"], n, "{t}");
    let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {t}"));
    assert!(f("alone_commands") > 0.0 && f("during_commands") > 0.0, "{t}");
    assert!(f("alone_p50_ms") <= f("alone_p99_ms") && f("during_p50_ms") <= f("during_p99_ms"), "{t}");
    assert!((f("ratio") - f("during_p99_ms") / f("alone_p99_ms")).abs() < 1e-9, "{t}");
    let strict = &t["log_order"];
    let g = |k: &str| strict[k].as_f64().unwrap_or_else(|| panic!("log_order.{k} missing in {t}"));
    assert!(g("alone_commands") > 0.0 && g("during_commands") > 0.0 && g("during_p50_ms") <= g("during_p99_ms"), "{t}");
    assert!((g("ratio") - g("during_p99_ms") / g("alone_p99_ms")).abs() < 1e-9, "{t}");
    // The broker's part: every quiet command sent during the flood was
    // read by the plain consumer and measured.
    let broker = &t["broker"];
    let h = |k: &str| broker[k].as_f64().unwrap_or_else(|| panic!("broker.{k} missing in {t}"));
    assert!(h("sent_during") > 0.0 && h("during_commands") == h("sent_during"), "{t}");
    assert!(h("alone_p50_ms") <= h("alone_p99_ms") && h("during_p50_ms") <= h("during_p99_ms"), "{t}");
    // Held against what the broker allows: the larger of the p99 alone and
    // the plain consumer's p99 during the flood.
    let bound = f("alone_p99_ms").max(h("during_p99_ms"));
    assert!((f("broker_bounded_ratio") - f("during_p99_ms") / bound).abs() < 1e-9, "{t}");
    // What the index took during the flood, both tenants' commands.
    let rate = (n as f64 + f("during_commands")) / f("drain_seconds");
    assert!((f("index_commands_per_sec") - rate).abs() < 1e-6 * rate, "{t}");
    assert!((f("quiet_share_of_index") - t["rate"].as_f64().unwrap() / rate).abs() < 1e-9, "{t}");
}

/// The profile-change and mixed-log phases ran with `users` users, beside
/// their baselines of the same run.
fn profiles_measured(r: &serde_json::Value, users: u64, positive: &dyn Fn(&serde_json::Value, &str) -> f64) {
    let p = &r["profile_changes"];
    assert_eq!(p["users"], users);
    let (rate, ratio, single) = (positive(&p["rate"], "profile rate"), positive(&p["ratio"], "profile ratio"), positive(&p["single_document_rate"], "post upserts"));
    assert!((ratio - rate / single).abs() < 1e-9, "profile changes: {ratio} != {rate} / {single}");
    let m = &r["mixed_log"];
    assert_eq!(m["commands"], users * 21);
    let (rate, ratio, base) = (positive(&m["rate"], "mixed rate"), positive(&m["ratio"], "mixed ratio"), positive(&m["baseline_rate"], "mixed baseline"));
    assert!((ratio - rate / base).abs() < 1e-9, "mixed log: {ratio} != {rate} / {base}");
    // The same profile changes through the files-and-posts model, beside
    // its own post upserts and the compiled-in phase's figures.
    let g = &r["model_profile_changes"];
    assert_eq!((&g["model"], &g["users"]), (&"files_and_posts".into(), &users.into()), "{g}");
    let (rate, ratio, single) = (positive(&g["rate"], "model profile rate"), positive(&g["ratio"], "model profile ratio"), positive(&g["single_document_rate"], "model post upserts"));
    assert!((ratio - rate / single).abs() < 1e-9, "model profile changes: {ratio} != {rate} / {single}");
    assert_eq!((&g["compiled_in_rate"], &g["compiled_in_single_document_rate"]), (&p["rate"], &p["single_document_rate"]), "{g}");
}

/// The verify phase: a whole verify of at least `documents`, clean (the
/// phase fails otherwise), its ratio the quotient of its time and the
/// rebuild's measured in the same run, peak memory sampled.
fn verify_measured(r: &serde_json::Value, documents: u64) {
    let v = &r["verify"];
    assert!(v["documents"].as_u64().is_some_and(|n| n >= documents), "{v}");
    let (secs, rebuild, ratio) = (v["seconds"].as_f64().unwrap(), v["rebuild_seconds"].as_f64().unwrap(), v["ratio"].as_f64().unwrap());
    assert!(secs > 0.0 && rebuild > 0.0 && (ratio - secs / rebuild).abs() < 1e-9, "{v}");
    assert!(v["peak_anon_kb"].as_u64().is_some_and(|k| k > 1000) && v["sample_10_seconds"].as_f64().is_some_and(|s| s > 0.0), "{v}");
}

/// The head-of-line phase measured the other key idle and during the
/// rename, searchable and with `produce --wait`, with lanes and with one
/// lane, and its ratio is theirs.
fn head_of_line_measured(r: &serde_json::Value) {
    let hol = &r["head_of_line"];
    let positive = |x: &serde_json::Value, what: &str| {
        let f = x.as_f64().unwrap_or_else(|| panic!("{what} missing in {hol:#}"));
        assert!(f.is_finite() && f > 0.0, "{what} = {f}");
        f
    };
    for run in ["lanes", "one_lane"] {
        // The worker's heap was sampled during the rename.
        assert!(positive(&hol[run]["worker_peak_anon_kb"], "peak heap") >= positive(&hol[run]["worker_anon_before_kb"], "heap before"), "{hol:#}");
        for series in ["idle", "during", "wait_idle", "wait_during"] {
            assert!(hol[run][format!("{series}_commands")].as_u64().unwrap_or(0) > 0, "{run} {series}: no command measured in {hol:#}");
            let (p50, p99) = (positive(&hol[run][format!("{series}_p50_ms")], "p50"), positive(&hol[run][format!("{series}_p99_ms")], "p99"));
            assert!(p50 <= p99, "{run} {series}: p50 {p50} > p99 {p99}");
        }
    }
    let ratio = positive(&hol["ratio"], "head-of-line ratio");
    assert!((ratio - hol["lanes"]["during_p99_ms"].as_f64().unwrap() / hol["lanes"]["idle_p99_ms"].as_f64().unwrap()).abs() < 1e-9);
    // The restart in the middle of the rename: each command the new owner
    // reads again it applies again or skips as done; with the rename in
    // flight, that is every command of the other key.
    let re = &r["reapply"];
    positive(&re["other_key_seconds"], "time until another key moves after the restart");
    positive(&re["idle_restart_other_key_seconds"], "the same after a restart with nothing in flight");
    let n = |k: &str| re[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {re:#}"));
    assert!(n("first_worker_applied") >= n("others"), "{re:#}");
    assert_eq!(n("applied_again") + n("skipped_as_done"), n("read_again"), "{re:#}");
    if re["rename_running_at_stop"].as_bool().unwrap() {
        assert!(n("read_again") >= n("others"), "{re:#}");
    }
}

/// The key-concurrency phase measured both numbers of keys, with lanes and
/// with one lane, and its ratios are theirs.
fn key_concurrency_measured(r: &serde_json::Value) {
    let kc = &r["key_concurrency"];
    assert_eq!(kc["commands"], 500, "{kc:#}");
    let runs = kc["runs"].as_array().unwrap_or_else(|| panic!("no runs in {kc:#}"));
    assert_eq!(runs.iter().map(|x| x["keys"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 100]);
    for run in runs {
        let f = |k: &str| run[k].as_f64().filter(|f| f.is_finite() && *f > 0.0).unwrap_or_else(|| panic!("{k} missing or not positive in {run:#}"));
        assert!((f("ratio") - f("lanes_rate") / f("one_lane_rate")).abs() < 1e-9, "{run:#}");
    }
}
