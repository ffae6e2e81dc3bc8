use super::*;
use crate::command::moves::{MoveIn, MovedFile};
use crate::command::partitioner::partition_of;
use crate::command::Envelope;

fn at(partition: i32, offset: i64) -> LogPosition {
    LogPosition { partition, offset }
}

fn command(codec: &Codec, c: Command, after: Option<LogPosition>) -> (Vec<u8>, Vec<u8>) {
    let key = c.key().as_bytes().to_vec();
    let mut e = Envelope::new(c);
    e.after = after;
    (key, codec.encode(&e))
}

fn chunk(codec: &Codec, source: LogPosition) -> (Vec<u8>, Vec<u8>) {
    let m = MoveIn {
        move_id: "m".into(),
        source_partition: source.partition,
        source_offset: source.offset,
        from: "/s/a".into(),
        to: "/d/a".into(),
        chunk: 0,
        last: true,
        issued_at: 0,
        files: vec![MovedFile { id: "f".into(), path: "/d/a/f.txt".into(), contents: String::new() }],
        aborted: false,
    };
    (b"/d".to_vec(), codec.encode_move(&m))
}

fn copied(p: Placed) -> (LogPosition, Option<Vec<u8>>) {
    match p {
        Placed::Copy { at, payload } => (at, payload),
        other => panic!("not copied: {other:?}"),
    }
}

#[test]
fn each_message_lands_in_its_keys_partition_at_the_next_offset_there() {
    let codec = Codec::new();
    let mut plan = Plan::new(2, 3);
    let mut ends = [0i64; 3];
    for (i, dir) in ["/a", "/b", "/c", "/a", "/d", "/e"].iter().enumerate() {
        let (k, v) = command(&codec, Command::UpsertFile { id: format!("f{i}"), path: format!("{dir}/f.txt"), contents: String::new(), previous_path: None }, None);
        let (placed, payload) = copied(plan.place(&codec, (i % 2) as i32, (i / 2) as i64, Some(&k), Some(&v)));
        let want = partition_of(dir, 3);
        assert_eq!(placed, at(want, ends[want as usize]), "{dir}");
        ends[want as usize] += 1;
        assert_eq!(payload, None, "copied as it is");
    }
    // Without a key: its source partition's number.
    let (placed, _) = copied(plan.place(&codec, 1, 3, None, Some(b"x")));
    assert_eq!(placed.partition, 1);
}

#[test]
fn a_moves_chunk_waits_for_its_rename_then_names_the_renames_new_place() {
    let codec = Codec::new();
    let mut plan = Plan::new(2, 4);
    // The chunk (partition 1) is read before its rename (partition 0,
    // offset 1) is copied: it waits.
    let (ck, cv) = chunk(&codec, at(0, 1));
    assert_eq!(plan.place(&codec, 1, 0, Some(&ck), Some(&cv)), Placed::Waits(at(0, 1)));
    let (k, v) = command(&codec, Command::UpsertFile { id: "x".into(), path: "/s/x.txt".into(), contents: String::new(), previous_path: None }, None);
    copied(plan.place(&codec, 0, 0, Some(&k), Some(&v)));
    let (k, v) = command(&codec, Command::RenamePath { from: "/s/a".into(), to: "/d/a".into() }, None);
    let (rename_at, _) = copied(plan.place(&codec, 0, 1, Some(&k), Some(&v)));
    assert_eq!(rename_at, at(partition_of("/s", 4), 1), "after the upsert of the same key");
    let (chunk_at, payload) = copied(plan.place(&codec, 1, 0, Some(&ck), Some(&cv)));
    assert_eq!(chunk_at.partition, partition_of("/d", 4));
    let Ok(Decoded::Move(m)) = codec.decode_message(&payload.expect("rewritten")) else { panic!("a move") };
    assert_eq!((m.source_partition, m.source_offset), (rename_at.partition, rename_at.offset));
    assert_eq!(m.files.len(), 1, "the rest of the chunk kept");
}

#[test]
fn an_owner_changes_after_names_its_deletes_new_place() {
    let codec = Codec::new();
    let mut plan = Plan::new(2, 3);
    let upsert = Command::UpsertFile { id: "f".into(), path: "/n/f.txt".into(), contents: String::new(), previous_path: Some("/o/f.txt".into()) };
    let (uk, uv) = command(&codec, upsert.clone(), Some(at(0, 0)));
    assert_eq!(plan.place(&codec, 1, 0, Some(&uk), Some(&uv)), Placed::Waits(at(0, 0)));
    let (k, v) = command(&codec, Command::DeleteFile { id: "f".into(), path: "/o/f.txt".into() }, None);
    let (delete_at, _) = copied(plan.place(&codec, 0, 0, Some(&k), Some(&v)));
    let (_, payload) = copied(plan.place(&codec, 1, 0, Some(&uk), Some(&uv)));
    let e = codec.decode(&payload.expect("rewritten")).unwrap();
    assert_eq!(e.after, Some(delete_at));
    assert_eq!(e.command, upsert);
    // An `after` naming something else than a delete is left out.
    let (k, v) = command(&codec, Command::UpsertUser { id: "u".into(), name: "n".into(), email: "e".into(), dob: "d".into() }, None);
    copied(plan.place(&codec, 0, 1, Some(&k), Some(&v)));
    let (uk, uv) = command(&codec, upsert, Some(at(0, 1)));
    let (_, payload) = copied(plan.place(&codec, 1, 1, Some(&uk), Some(&uv)));
    assert_eq!(codec.decode(&payload.expect("rewritten")).unwrap().after, None);
}

/// A `dlq reprocess` names the letters' origins and where they were
/// written: a rebuild from the new topic decides parking on positions,
/// which must be the new topic's, and writes its marker to the
/// dead-letter partition of the key's new place.
#[test]
fn an_operators_control_message_names_the_new_places_its_letters_record() {
    use crate::command::control::{Action, Control};
    let codec = Codec::new();
    let mut plan = Plan::new(2, 3);
    // Source partition 1: an upsert of another key, the poison of /k at
    // offset 1 (a letter), a parked upsert at 2 (a letter), then the
    // REPLAY of the parked one.
    plan.lettered(at(1, 1));
    plan.lettered(at(1, 2));
    let (k, v) = command(&codec, Command::UpsertFile { id: "o".into(), path: "/other/o.txt".into(), contents: String::new(), previous_path: None }, None);
    copied(plan.place(&codec, 1, 0, Some(&k), Some(&v)));
    let (poison_at, _) = copied(plan.place(&codec, 1, 1, Some(b"/k"), Some(b"not avro")));
    let (k, v) = command(&codec, Command::UpsertFile { id: "f".into(), path: "/k/f.txt".into(), contents: String::new(), previous_path: None }, None);
    let (parked_at, _) = copied(plan.place(&codec, 1, 2, Some(&k), Some(&v)));
    assert_eq!(parked_at, at(partition_of("/k", 3), poison_at.offset + 1));
    let replay = Control { action: Action::Replay, key: "/k".into(), dlq_partition: 1, dlq_offset: 7, through: 8, origin_offset: 2, payload: v.clone(), requested_at: 0, through_at: 2 };
    let Placed::Control { at: replay_at, payload, unplaced: false } = plan.place(&codec, 1, 3, Some(b"/k"), Some(&codec.encode_control(&replay))) else { panic!("a control") };
    assert_eq!(replay_at, at(parked_at.partition, parked_at.offset + 1));
    let Ok(Decoded::Control(c)) = codec.decode_message(&payload) else { panic!("a control") };
    assert_eq!(c, Control { origin_offset: parked_at.offset, through_at: parked_at.offset, dlq_partition: crate::dlq::partition_for(parked_at.partition, 3), ..replay });
    // Had it replayed a rename across trees, its chunks name the REPLAY.
    let (ck, cv) = chunk(&codec, at(1, 3));
    let (_, payload) = copied(plan.place(&codec, 0, 0, Some(&ck), Some(&cv)));
    let Ok(Decoded::Move(m)) = codec.decode_message(&payload.expect("rewritten")) else { panic!("a move") };
    assert_eq!((m.source_partition, m.source_offset), (replay_at.partition, replay_at.offset));
    // A position no letter records (expired): -1, said.
    let resolve = Control { action: Action::Resolve, origin_offset: -1, through_at: 0, payload: Vec::new(), ..c };
    let Placed::Control { payload, unplaced: true, .. } = plan.place(&codec, 1, 4, Some(b"/k"), Some(&codec.encode_control(&resolve))) else { panic!("a control") };
    let Ok(Decoded::Control(c)) = codec.decode_message(&payload) else { panic!("a control") };
    assert_eq!((c.origin_offset, c.through_at), (-1, -1));
}

fn chunk_of(codec: &Codec, source: LogPosition, chunk: i32, last: bool) -> (Vec<u8>, Vec<u8>) {
    let m = MoveIn {
        chunk,
        last,
        ..codec
            .decode_message(&self::chunk(codec, source).1)
            .ok()
            .and_then(|d| match d {
                Decoded::Move(m) => Some(m),
                _ => None,
            })
            .expect("a move")
    };
    (b"/d".to_vec(), codec.encode_move(&m))
}

/// Two old partitions merge into one: a move from each to `/d`, whose
/// chunks came in the other order than their renames land in the new
/// partition. The destination would take the second for a resend of
/// the first (its rule: the highest completed rename per source
/// partition), so the copy refuses; one that ends before the other
/// starts passes, and so do moves interleaved the way the destination
/// takes them (one at a time, the others passed over).
#[test]
fn a_move_put_behind_a_later_one_of_its_new_source_partition_is_refused() {
    let codec = Codec::new();
    let rename = |from: &str| command(&codec, Command::RenamePath { from: from.into(), to: format!("/d{from}") }, None);
    // Old partition 0: the rename of /a; old partition 1: the rename
    // of /b, then the destination's chunks: /b's first, then /a's.
    let mut plan = Plan::new(2, 1);
    let (k, v) = rename("/a");
    copied(plan.place(&codec, 0, 0, Some(&k), Some(&v)));
    let (k, v) = rename("/b");
    copied(plan.place(&codec, 1, 0, Some(&k), Some(&v)));
    let (k, v) = chunk_of(&codec, at(1, 0), 0, true);
    copied(plan.place(&codec, 1, 1, Some(&k), Some(&v)));
    let (k, v) = chunk_of(&codec, at(0, 0), 0, true);
    assert_eq!(plan.place(&codec, 1, 2, Some(&k), Some(&v)), Placed::Reordered { destination: 0 });

    // Both renames in one old partition: the chunks of /b's move come
    // while /a's is in flight (first chunk, /b's, /a's last): the
    // destination completes /a's first, then reads /b's again.
    let mut plan = Plan::new(2, 1);
    let (k, v) = rename("/a");
    copied(plan.place(&codec, 0, 0, Some(&k), Some(&v)));
    let (k, v) = rename("/b");
    copied(plan.place(&codec, 0, 1, Some(&k), Some(&v)));
    for (i, (source, n, last)) in [(at(0, 0), 0, false), (at(0, 1), 0, true), (at(0, 0), 1, true), (at(0, 1), 0, true)].into_iter().enumerate() {
        let (k, v) = chunk_of(&codec, source, n, last);
        copied(plan.place(&codec, 1, i as i64, Some(&k), Some(&v)));
    }
}

#[test]
fn a_chunk_whose_rename_cannot_be_read_is_left_out() {
    let codec = Codec::new();
    let mut plan = Plan::new(1, 2);
    copied(plan.place(&codec, 0, 0, Some(b"/s"), Some(b"\0\0\0\0\x07registry framed")));
    let (ck, cv) = chunk(&codec, at(0, 0));
    assert_eq!(plan.place(&codec, 0, 1, Some(&ck), Some(&cv)), Placed::Dropped);
    assert!(plan.is_placed(at(0, 1)));
}
