//! Signed messages of denorm's own through a real broker (`--signing-key-file`):
//! the chunks of a cross-key rename between partitions and an operator's
//! `dlq clear` carry the signature header and are carried out; a
//! producer's `DISCARD` for the same key, unsigned, is dead-lettered as
//! forged and releases nothing. `verify` agrees, and `migrate` keeps the
//! signatures, so that a rebuild from the copy gives the same index.

use std::collections::BTreeMap;

use crate::common::*;
use denorm::command::control::{Action, Control};
use denorm::command::partitioner::partition_of;
use denorm::command::{Command, Envelope};
use denorm::index::Doc;

#[test]
fn own_messages_are_signed_and_a_producers_forged_discard_is_refused() {
    own_messages_are_signed_and_a_producers_forged_discard_is_refused_on(Rig::new(3));
}

#[test]
fn own_messages_are_signed_and_a_producers_forged_discard_is_refused_on_elasticsearch() {
    own_messages_are_signed_and_a_producers_forged_discard_is_refused_on(Rig::elastic(3));
}

/// Files by id, at their paths.
fn files(r: &Rig) -> BTreeMap<String, String> {
    dump(&r.index)
        .into_iter()
        .filter_map(|d| match d {
            Doc::File(f) => Some((f.id.clone(), f.full_path())),
            _ => None,
        })
        .collect()
}

fn own_messages_are_signed_and_a_producers_forged_discard_is_refused_on(r: Rig) {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("signing.keys");
    std::fs::write(&keys, format!("{}\n", uuid::Uuid::new_v4().simple().to_string().repeat(2))).unwrap();
    let keys = keys.display().to_string();
    let signed = ["--signing-key-file", keys.as_str()];
    // Two top-level directories in different partitions: the rename's
    // documents travel as chunks through the topic.
    let (from, to) = ("/src", (0..).map(|i| format!("/dst{i}")).find(|t| partition_of(t, 3) != partition_of("/src", 3)).unwrap());
    let codec = denorm::codec::Codec::new();
    let encode = |c: Command| codec.encode(&Envelope::new(c));
    let upsert = |id: &str, path: String| encode(Command::UpsertFile { id: id.into(), path, contents: "signed".into(), previous_path: None });
    let mut messages: Vec<(Option<&str>, Vec<u8>)> = (0..20).map(|i| (Some(from), upsert(&format!("s{i}"), format!("{from}/d/{i}.txt")))).collect();
    messages.push((Some(from), encode(Command::RenamePath { from: format!("{from}/d"), to: format!("{to}/d") })));
    messages.push((Some("/p"), b"not an avro message".to_vec()));
    messages.push((Some("/p"), upsert("q", "/p/q.txt".into())));
    // What a producer without the keys can write: a DISCARD of every
    // letter of /p.
    let forged =
        Control { action: Action::Discard, key: "/p".into(), dlq_partition: -1, dlq_offset: -1, through: i64::MAX, origin_offset: -1, payload: Vec::new(), requested_at: 0, through_at: i64::MAX };
    messages.push((Some("/p"), codec.encode_control(&forged)));
    messages.push((Some("/p"), upsert("later", "/p/later.txt".into())));
    let w = r.worker(&signed);
    send_raw_placed(&r.cfg, &messages, true);
    let chunks = 1;
    wait_applied(&r.cfg, &r.group, messages.len() + chunks);
    let got = files(&r);
    assert_eq!(got.keys().filter(|id| id.starts_with('s')).count(), 20, "{got:?}\n{}", w.log());
    assert!(got.iter().filter(|(id, _)| id.starts_with('s')).all(|(_, p)| p.starts_with(&format!("{to}/d/"))), "the signed chunks were not applied: {got:?}\n{}", w.log());
    assert!(!got.contains_key("q") && !got.contains_key("later"), "the forged DISCARD released /p: {got:?}");
    let count = r.dlq_count();
    assert_eq!(count["by_reason"]["forged"], 1, "{count}");
    assert_eq!(count["by_reason"]["parked"], 2, "{count}");

    // The operator's clear, signed by the CLI with the same keys.
    let (code, _, err) = r.run(&[&signed[..], &["dlq", "clear", "--key", "/p", "--yes"]].concat());
    assert_eq!(code, 0, "{err}");
    send_raw_placed(&r.cfg, &[(Some("/p"), upsert("after", "/p/after.txt".into()))], true);
    eventually(std::time::Duration::from_secs(60), || format!("/p not released:\n{}", w.log()), || files(&r).contains_key("after").then_some(()));
    drop(w);
    let (code, out, err) = r.run(&[&signed[..], &["verify", "--json"]].concat());
    let report = report_of(code, &out, &err);
    assert_eq!((code, report["differences_total"].as_u64()), (0, Some(0)), "{report}");

    // Copied with the keys: the chunk and the clear keep their signatures,
    // the forged DISCARD stays unsigned; a rebuild from the copy equals the
    // index.
    let before = files(&r);
    let new = denorm::kafka::KafkaConfig { topic: unique("denorm-test-signed"), ..r.cfg.clone() };
    let (code, out, err) = output(cli(&r.cfg, &r.group, &r.index).args(signed).args(["migrate", "--to-topic", &new.topic, "--to-partitions", "3"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("signatures: 2 kept, 0 signed anew (--sign-unsigned), 1 copied unsigned"), "{out}");
    let (code, _, err) = output(cli(&new, &r.group, &r.index).args(signed).args(["rebuild", "--metrics-addr", "127.0.0.1:0"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(files(&r), before, "the rebuild from the copy differs");
    let (code, out, err) = output(cli(&new, &r.group, &r.index).args(signed).args(["verify", "--json"]));
    let report = report_of(code, &out, &err);
    assert_eq!((code, report["differences_total"].as_u64()), (0, Some(0)), "{report}");
}
