//! A command topic recorded as producers wrote it with command schema
//! versions 1 and 2 (`tests/fixtures/recorded/topic-v1-v2.jsonl`, written by
//! fastavro from `schemas/history/`): replayed on a real broker by a fresh
//! worker, on both backends, it gives the documents that the same messages
//! mean read as `models/files-and-posts.toml`'s commands, and those of the
//! compiled-in reference, and `verify` finds the index equal to its log.

use std::collections::BTreeMap;

use crate::common::*;
use denorm::codec::Decoded;
use denorm::command::generic::legacy;
use denorm::model::generic::{legacy::as_compiled_in, ModelReference};

const RECORDED: &str = include_str!("../fixtures/recorded/topic-v1-v2.jsonl");

/// The recorded messages, `(key, value)`, in the order produced.
fn recorded() -> Vec<(String, Vec<u8>)> {
    RECORDED
        .lines()
        .map(|line| {
            let m: serde_json::Value = serde_json::from_str(line).unwrap();
            let hex = m["value"].as_str().unwrap();
            let value = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            (m["key"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

#[test]
fn every_recorded_message_decodes_as_the_schema_version_it_was_written_with() {
    let codec = denorm::codec::Codec::new();
    let mut tenants = BTreeMap::new();
    for (key, value) in recorded() {
        let e = codec.decode(&value).unwrap_or_else(|err| panic!("{key}: {err}"));
        *tenants.entry(e.tenant.clone()).or_insert(0) += 1;
        // What the worker keys it by is what its producer keyed it by.
        assert_eq!(e.command.key(), key, "{e:?}");
    }
    assert_eq!(tenants, BTreeMap::from([(None, 34), (Some("acme".to_string()), 17)]));
}

#[test]
fn a_topic_recorded_with_schema_versions_1_and_2_replays_into_the_files_and_posts_model() {
    replayed(Rig::new(3));
}

#[test]
fn a_topic_recorded_with_schema_versions_1_and_2_replays_into_the_files_and_posts_model_on_elasticsearch() {
    replayed(Rig::elastic(3));
}

fn replayed(r: Rig) {
    let messages = recorded();
    let raw: Vec<(Option<&str>, Vec<u8>)> = messages.iter().map(|(k, v)| (Some(k.as_str()), v.clone())).collect();
    send_raw_placed(&r.cfg, &raw, true);
    let w = r.worker(&[]);
    wait_applied_by(&r.cfg, &r.group, messages.len(), &[&w]);
    let logs = read_decodable(&r.cfg);
    assert_eq!(logs.iter().map(Vec::len).sum::<usize>(), messages.len(), "every recorded message is a command of the topic");
    // The compiled-in reference of the log.
    assert_matches_model_of_logs(&logs, &r.index);
    // The model's reference of the same log, partition by partition.
    let mut model = ModelReference::new(legacy::domain().clone());
    for (_, d) in logs.iter().flatten() {
        let Decoded::Command(e) = d else { panic!("not a command: {d:?}") };
        model.apply(&legacy::to_model(e));
    }
    let diffs = denorm::model::diff(as_compiled_in(&model), dump(&r.index), 10);
    assert!(diffs.is_empty(), "the index differs from the files-and-posts model's replay:\n{}", diffs.join("\n"));
    assert_verify_clean(&r.cfg, &r.group, &r.index);
    w.terminate();
}
