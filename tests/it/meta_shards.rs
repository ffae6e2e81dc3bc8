//! The meta index's primary shards (review of Elasticsearch, F12): every
//! commit of every partition is a conditional write of the partition's
//! meta document, all of them into `denorm-meta`. New deployments choose
//! its primaries (`DENORM_ES_META_SHARDS`, tested by the two-worker
//! pipeline test on Elasticsearch); an existing one is split as
//! docs/elasticsearch.md says, and the workers go on from their
//! checkpoints.

use crate::common::*;
use denorm::index::elastic::setup::meta_shards_of;
use elasticsearch::Elasticsearch;
use serde_json::{json, Value};

/// The requests of docs/elasticsearch.md, *The meta index's primary
/// shards*, with the workers stopped: block writes, split into `shards`
/// primaries, and in one request delete the old index and give the new one
/// its name as an alias.
async fn split_meta(client: &Elasticsearch, meta: &str, shards: u32) {
    use elasticsearch::indices::{IndicesPutSettingsParts, IndicesSplitParts};
    let split = format!("{meta}-split");
    let ok = |what: &str, r: elasticsearch::http::response::Response| {
        assert!(r.status_code().is_success(), "{what}: {}", r.status_code());
    };
    ok("block writes", client.indices().put_settings(IndicesPutSettingsParts::Index(&[meta])).body(json!({"index.blocks.write": true})).send().await.unwrap());
    ok("split", client.indices().split(IndicesSplitParts::IndexTarget(meta, &split)).body(json!({"settings": {"index.number_of_shards": shards, "index.blocks.write": null}})).send().await.unwrap());
    let health: Value =
        client.cluster().health(elasticsearch::cluster::ClusterHealthParts::Index(&[&split])).wait_for_status(elasticsearch::params::WaitForStatus::Yellow).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["timed_out"], false, "{health}");
    ok("swap", client.indices().update_aliases().body(json!({"actions": [{"remove_index": {"index": meta}}, {"add": {"index": split, "alias": meta}}]})).send().await.unwrap());
}

#[test]
fn an_existing_meta_index_split_as_documented_keeps_every_checkpoint_on_elasticsearch() {
    let r = Rig::elastic(3);
    let (cfg, group, index) = (&r.cfg, r.group.as_str(), r.index.as_path());
    let mut log = produce(cfg, denorm::demo::seed(600, 20, 100, 3));
    let worker = Worker::start(cfg, group, index, &[]);
    wait_applied_by(cfg, group, log.len(), &[&worker]);
    assert!(worker.terminate().success());

    let rt = rt();
    let es = elastic::backend(&index.to_string_lossy(), &rt, "");
    let meta = denorm::index::elastic::names::meta_index(&es.prefix);
    assert_eq!(rt.block_on(meta_shards_of(&es.client, &es.prefix)).unwrap(), Some(1));
    rt.block_on(split_meta(&es.client, &meta, 4));
    assert_eq!(rt.block_on(meta_shards_of(&es.client, &es.prefix)).unwrap(), Some(4), "read through the alias");

    // Each partition resumes at its checkpoint, read from the split index:
    // its own message is read again and skipped, nothing is applied again.
    let worker = Worker::start(cfg, group, index, &[]);
    worker.assert_resumed_at_checkpoints(3);
    // Its DENORM_ES_META_SHARDS (unset: 1) differs from the index's 4: said.
    assert!(worker.log_contains("the meta index exists with another number of primary shards"), "{}", worker.log());
    // And goes on writing its checkpoints there.
    log.extend(produce(cfg, denorm::demo::user_renames(10, 3)));
    wait_applied_by(cfg, group, log.len(), &[&worker]);
    assert_matches_model(index, &log);
}
