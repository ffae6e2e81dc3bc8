//! `denorm bench --elasticsearch URL`: the phases of the benchmark against
//! an Elasticsearch cluster, each beside what a user would write by hand
//! against the same cluster in the same run:
//! - the replay and the single-document updates against a plain `_bulk` of
//!   the same documents into an index with the same mapping;
//! - each directory rename against `_update_by_query` with a painless
//!   script over the same directory of the same documents;
//! - produce -> searchable latency, found by a `_search` (not a realtime
//!   GET), beside the broker's acknowledgement and a plain consumer.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use elasticsearch::{SearchParts, UpdateByQueryParts};
use serde_json::{json, Map, Value};

use super::{file_doc, moved_dir, per_sec, phase, single_docs, tree, tree_dir, Bench, Probe, Row};
use denorm::command::Command;
use denorm::index::elastic::backend::ElasticBackend;
use denorm::index::elastic::bulk::{self, BulkOp};
use denorm::index::elastic::config::ElasticConfig;
use denorm::index::elastic::docs::{scan_query, to_source};
use denorm::index::elastic::{complete_json, generations, mapping, names};
use denorm::index::{Kind, Scan};
use denorm::produce::Producer;

/// The benchmark's backend: the cluster at `url` (credentials from
/// `DENORM_ES_*`), under an index prefix of this run's own.
pub(super) fn backend(url: &str, run_id: &str, topic: &str) -> anyhow::Result<ElasticBackend> {
    let mut cfg = ElasticConfig::from_env(url)?;
    cfg.prefix = format!("denorm-bench-{run_id}");
    Ok(ElasticBackend::new(cfg.client()?, &cfg.prefix, topic, tokio::runtime::Handle::current()))
}

/// Which of the ids a search of the files' read alias finds now.
pub(super) fn probe(es: ElasticBackend) -> Probe {
    let alias = names::alias(&es.prefix, Kind::File);
    Box::new(move |ids: &[String]| {
        let body = json!({"query": {"ids": {"values": ids}}, "_source": false, "size": ids.len()});
        let v = es.runtime.block_on(async {
            let r = es.client.search(SearchParts::Index(&[&alias])).body(body).send().await?;
            complete_json("searching for the latency probes", r).await
        })?;
        Ok(v["hits"]["hits"].as_array().into_iter().flatten().filter_map(|h| h["_id"].as_str().map(str::to_string)).collect())
    })
}

/// Runs the phases; the rows of the table and the results.
pub(super) async fn run(b: &Bench<'_>, url: &str, es: &ElasticBackend, producer: &Producer, run_id: &str) -> anyhow::Result<(Vec<Row>, Map<String, Value>)> {
    let a = b.a;
    eprintln!("denorm bench: elasticsearch {url}, indexes under the prefix {} (left for inspection)", es.prefix);
    let index = PathBuf::from(url);
    let group = format!("denorm-bench-{run_id}");
    let raw = format!("{}-raw-files", es.prefix);
    let (mut rows, mut results) = (Vec::new(), Map::new());

    // 1. Replay: single-document commands into empty indexes.
    phase("replay: producing single-document commands");
    let load = single_docs(a.docs, a.keys, 0);
    producer.send_all(load.clone(), 10_000, |_| {}).await?;
    phase("replay: raw baseline (a plain _bulk of the same documents into an index of the same mapping)");
    create_raw(es, &raw).await?;
    let raw_load = raw_bulk(es, &raw, &load).await?;
    drop(load);
    phase("replay: denorm run into empty indexes");
    let (worker, replay, cpu) = b.catch_up(&group, &index, "the replay").await?;
    let rate = a.docs as f64 / replay.as_secs_f64();
    rows.push(Row::new(format!("replay of {} commands into empty indexes", a.docs), per_sec(rate, "commands"), format!("plain _bulk {}", per_sec(raw_load, "docs")), Some(rate / raw_load), ">= 80%"));
    results.insert("replay".into(), json!({"commands": a.docs, "seconds": replay.as_secs_f64(), "rate": rate, "raw_bulk_rate": raw_load, "ratio": rate / raw_load, "cpu": cpu}));

    // 2. Single-document updates of existing documents, as a backlog.
    phase("single-document updates: stopping the worker, producing as many updates");
    worker.stop().await?;
    let updates = single_docs(a.docs, a.keys, 1);
    producer.send_all(updates.clone(), 10_000, |_| {}).await?;
    phase("single-document updates: raw baseline (a plain _bulk of the updated documents)");
    let raw_updates = raw_bulk(es, &raw, &updates).await?;
    drop(updates);
    delete_raw(es, &raw).await?;
    phase("single-document updates: denorm run catches up");
    let (worker, took, cpu) = b.catch_up(&group, &index, "the updates").await?;
    let rate = a.docs as f64 / took.as_secs_f64();
    rows.push(Row::new(format!("{} single-document updates", a.docs), per_sec(rate, "commands"), format!("plain _bulk {}", per_sec(raw_updates, "docs")), Some(rate / raw_updates), ">= 80%"));
    results.insert("single_document".into(), json!({"commands": a.docs, "seconds": took.as_secs_f64(), "rate": rate, "raw_bulk_rate": raw_updates, "ratio": rate / raw_updates, "cpu": cpu}));
    // 3. Profile changes (small fan-outs) and a mixed log.
    let worker = b.profiles_phase(worker, &group, &index, producer, &mut rows, &mut results).await?;
    b.model_profiles_phase(run_id, Some(url), &mut rows, &mut results).await?;

    // 3. Directory renames against `_update_by_query`.
    for &size in &a.renames {
        phase(&format!("rename of {size} files: loading the tree"));
        let files = tree(size);
        producer.send_all(files.clone(), 10_000, |_| {}).await?;
        b.wait_applied(&worker, &index, None).await?;
        phase(&format!("rename of {size} files: raw baseline (_update_by_query with a painless script)"));
        create_raw(es, &raw).await?;
        raw_bulk(es, &raw, &files).await?;
        drop(files);
        let (raw_secs, n) = update_by_query(es, &raw, &tree_dir(size), &moved_dir(size), b.timeout).await?;
        delete_raw(es, &raw).await?;
        if n != size {
            bail!("_update_by_query updated {n} documents, expected {size}");
        }
        phase(&format!("rename of {size} files: denorm run"));
        let t = Instant::now();
        producer.send(Command::RenamePath { from: tree_dir(size), to: moved_dir(size) }).await?;
        let took = b.wait_applied(&worker, &index, Some(t)).await?;
        let (rate, raw_rate) = (size as f64 / took.as_secs_f64(), size as f64 / raw_secs);
        rows.push(Row::new(
            format!("rename of a directory of {size} files"),
            per_sec(rate, "docs"),
            format!("_update_by_query {}", per_sec(raw_rate, "docs")),
            Some(rate / raw_rate),
            if Some(&size) == a.renames.iter().max() { ">= 100%" } else { "" },
        ));
        results.insert(format!("rename_{size}"), json!({"files": size, "seconds": took.as_secs_f64(), "rate": rate, "raw_seconds": raw_secs, "raw_rate": raw_rate, "ratio": rate / raw_rate}));
    }

    // 4. Produce -> searchable, found by a search.
    if a.latency_secs > 0 {
        phase(&format!("latency: {} commands/s for {} s, produce -> found by a search", a.latency_rate, a.latency_secs));
        let l = b.latency(Producer::new(&b.kafka)?, &index).await?;
        l.report(a.latency_rate, &mut rows, &mut results);
    }
    // 5. Verify against rebuild, the worker running.
    if !a.skip_verify {
        b.verify_phase(&group, &index, &mut rows, &mut results).await?;
    }
    worker.stop().await?;
    // 5. Head of line: another key of the partition during a large rename.
    if a.head_of_line_files > 0 {
        b.head_of_line(a.head_of_line_files, a.head_of_line_rate, run_id, Some(url), &mut rows, &mut results).await?;
    }
    // 6. Key concurrency: single-document commands of many keys.
    if a.key_concurrency_commands > 0 {
        b.key_concurrency(a.key_concurrency_commands, &a.key_concurrency_keys, run_id, Some(url), &mut rows, &mut results).await?;
    }
    // 7. Tenant fairness: a quiet tenant beside a noisy one's backlog.
    if a.tenant_flood_commands > 0 {
        b.tenant_flood(a.tenant_flood_commands, a.head_of_line_rate, run_id, Some(url), &mut rows, &mut results).await?;
    }
    Ok((rows, results))
}

/// Creates the baseline's index behind the alias `raw` (the bulk engine
/// writes through aliases only), with the settings and mapping of denorm's
/// files index.
async fn create_raw(es: &ElasticBackend, raw: &str) -> anyhow::Result<()> {
    create_raw_of(es, raw, Kind::File).await
}

/// [`create_raw`] with the mapping of `kind`'s index.
async fn create_raw_of(es: &ElasticBackend, raw: &str, kind: Kind) -> anyhow::Result<()> {
    delete_raw(es, raw).await?;
    let body = json!({"settings": mapping::settings(), "mappings": mapping::mapping(kind), "aliases": {raw: {}}});
    generations::create_index(&es.client, &format!("{raw}-000001"), body).await?;
    Ok(())
}

async fn delete_raw(es: &ElasticBackend, raw: &str) -> anyhow::Result<()> {
    let index = format!("{raw}-000001");
    let r = es.client.indices().delete(elasticsearch::indices::IndicesDeleteParts::Index(&[&index])).send().await?;
    if !r.status_code().is_success() && r.status_code().as_u16() != 404 {
        bail!("deleting the baseline's index {raw}: {}", r.status_code());
    }
    Ok(())
}

/// Indexes the documents of `commands` into `raw` with plain `_bulk`
/// requests of denorm's own size limits, one at a time (the engine of
/// [`bulk::execute`], which retries only what failed); documents per second.
async fn raw_bulk(es: &ElasticBackend, raw: &str, commands: &[Command]) -> anyhow::Result<f64> {
    let ops: Vec<BulkOp> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let doc = file_doc(c, i as u64);
            BulkOp::Index { index: raw.to_string(), id: doc.id().to_string(), source: to_source(&doc), if_seq_no: None }
        })
        .collect();
    let n = ops.len();
    let t = Instant::now();
    let report = bulk::execute(&es.client, ops, es.limits, es.policy).await?;
    let secs = t.elapsed().as_secs_f64();
    if report.done != n || !report.failed.is_empty() {
        bail!("the baseline's _bulk indexed {} of {n} documents: {:?}", report.done, report.failed.first());
    }
    eprintln!("       plain _bulk: {n} documents in {secs:.2}s ({} requests)", report.requests);
    Ok(n as f64 / secs)
}

/// A plain `_bulk` of `docs` (of every kind, each into a baseline index of
/// its kind's mapping, in one stream of requests of denorm's own size
/// limits), as a hand-written indexer of the same data would send them;
/// documents per second. The baseline indexes are deleted afterwards.
pub(super) async fn raw_bulk_docs(es: &ElasticBackend, docs: &[denorm::index::Doc]) -> anyhow::Result<f64> {
    let raw = |kind: Kind| format!("{}-raw-{}", es.prefix, kind.as_str());
    for kind in [Kind::File, Kind::User, Kind::Post] {
        create_raw_of(es, &raw(kind), kind).await?;
    }
    let ops: Vec<BulkOp> = docs.iter().map(|d| BulkOp::Index { index: raw(d.kind()), id: d.id().to_string(), source: to_source(d), if_seq_no: None }).collect();
    let n = ops.len();
    let t = Instant::now();
    let report = bulk::execute(&es.client, ops, es.limits, es.policy).await?;
    let secs = t.elapsed().as_secs_f64();
    for kind in [Kind::File, Kind::User, Kind::Post] {
        delete_raw(es, &raw(kind)).await?;
    }
    if report.done != n || !report.failed.is_empty() {
        bail!("the baseline's _bulk indexed {} of {n} documents: {:?}", report.done, report.failed.first());
    }
    eprintln!("       plain _bulk: {n} documents in {secs:.2}s ({} requests)", report.requests);
    Ok(n as f64 / secs)
}

/// What a user would write by hand for a directory rename: one
/// `_update_by_query` over the files under `from` (denorm's own scan query)
/// with a painless script moving their paths to `to`, waited for. Its
/// seconds and the documents it updated.
async fn update_by_query(es: &ElasticBackend, raw: &str, from: &str, to: &str, timeout: std::time::Duration) -> anyhow::Result<(f64, u64)> {
    let (_, query) = scan_query(&Scan::FilesWithin { path: from.to_string() });
    let body = json!({
        "query": query,
        "script": {
            "lang": "painless",
            "source": "ctx._source.path = params.to + ctx._source.path.substring(params.from.length())",
            "params": {"from": from, "to": to},
        },
    });
    // The documents are searchable before the clock starts, as in a live
    // index.
    let r = es.client.indices().refresh(elasticsearch::indices::IndicesRefreshParts::Index(&[raw])).send().await?;
    complete_json("refreshing the baseline's index", r).await?;
    let t = Instant::now();
    let r = es
        .client
        .update_by_query(UpdateByQueryParts::Index(&[raw]))
        .conflicts(elasticsearch::params::Conflicts::Proceed)
        .refresh(true)
        .wait_for_completion(true)
        .request_timeout(timeout)
        .body(body)
        .send()
        .await
        .context("_update_by_query")?;
    let v = complete_json("the baseline's _update_by_query", r).await?;
    let secs = t.elapsed().as_secs_f64();
    if v["failures"].as_array().is_some_and(|f| !f.is_empty()) {
        bail!("the baseline's _update_by_query failed: {}", v["failures"]);
    }
    eprintln!("       _update_by_query: {} documents in {secs:.2}s", v["updated"]);
    Ok((secs, v["updated"].as_u64().unwrap_or(0)))
}
