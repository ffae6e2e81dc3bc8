//! denorm's own messages with signing keys (`--signing-key-file`): a
//! control message or a move's chunk without a valid signature is
//! dead-lettered as forged and parks nothing; the workers' and operators'
//! own, signed, are carried out.

use super::moves::{chunk, destination};
use super::*;
use crate::command::control::{Action, Control};
use crate::signing::Signing;

const KEY: &str = "0123456789abcdef0123456789abcdef";
const OTHER: &str = "a key producers might guess, not the workers' one";

fn keys(text: &str) -> Arc<Signing> {
    Arc::new(Signing::from_text(text).unwrap())
}

fn signed(tune: impl FnOnce(&mut WorkerConfig)) -> Rig {
    Rig::new(|c| {
        c.kafka.signing = Some(keys(KEY));
        tune(c);
    })
}

fn discard(through: i64, through_at: i64) -> Control {
    Control { action: Action::Discard, key: "/p".into(), dlq_partition: 0, dlq_offset: -1, through, origin_offset: -1, payload: Vec::new(), requested_at: 0, through_at }
}

/// The security review's finding 5: a producer's `DISCARD` for a parked
/// key silently dropped the key's parked commands. With signing keys it is
/// dead-lettered as forged and the key stays parked; the operator's own
/// (signed) `DISCARD` releases it.
#[test]
fn a_forged_discard_leaves_the_key_parked_and_the_operators_own_releases_it() {
    let r = signed(|_| {});
    let poison = r.append("/p", b"not an avro message".to_vec());
    let parked = r.produce(upsert("q", "/p/q.txt"));
    let run = r.start();
    run.wait_next(parked + 1);
    // As a producer writes it: no signature, then one made with another key.
    let unsigned = r.append("/p", r.codec.encode_control(&discard(i64::MAX, i64::MAX)));
    let guessed = r.append_signed("/p", r.codec.encode_control(&discard(i64::MAX, i64::MAX)), &keys(OTHER));
    let later = r.produce(upsert("later", "/p/later.txt"));
    run.wait_next(later + 1);
    assert!(r.file_ids().is_empty(), "a forged DISCARD released the parked key: {:?}", r.letters());
    assert!(r.outbox.markers.lock().unwrap().is_empty(), "a forged DISCARD wrote a marker");
    let letters: Vec<(String, i64)> = r.letters().into_iter().map(|l| (l.reason, l.origin_offset)).collect();
    let want: Vec<(String, i64)> = [("not_single_object", poison), ("parked", parked), ("forged", unsigned), ("forged", guessed), ("parked", later)].into_iter().map(|(a, b)| (a.into(), b)).collect();
    assert_eq!(letters, want);
    // `denorm dlq clear --key /p` with the keys: every letter so far.
    r.append_signed("/p", r.codec.encode_control(&discard(4, later)), &keys(KEY));
    let after = r.produce(upsert("after", "/p/after.txt"));
    run.wait_next(after + 1);
    assert_eq!(run.stop(), after + 1);
    assert_eq!(r.file_ids(), vec!["after"], "the signed DISCARD released the key: {:?}", r.letters());
    assert_eq!(r.outbox.markers.lock().unwrap().clone(), vec![("/p".to_string(), MarkerKind::Cleared)]);
}

/// A forged chunk of a cross-key move writes nothing and parks nothing:
/// its destination key's own commands go on. The same chunk signed is
/// applied.
#[test]
fn a_forged_move_chunk_is_dead_lettered_and_its_destination_goes_on() {
    let r = destination(|c| c.kafka.signing = Some(keys(KEY)));
    let forged = r.produce_move(&chunk(7, 0, true, &["m1"]));
    let own = r.produce(upsert("own", "/dst/a/own.txt"));
    let run = r.start();
    run.wait_next(own + 1);
    assert_eq!(r.file_ids(), vec!["own"], "the forged chunk wrote files, or parked its key");
    assert_eq!(r.letters(), vec![Sent { reason: "forged".into(), origin_offset: forged, key: "/dst".into() }]);
    let at = r.append_signed("/dst", r.codec.encode_move(&chunk(8, 0, true, &["m2"])), &keys(KEY));
    run.wait_next(at + 1);
    assert_eq!(run.stop(), at + 1);
    assert_eq!(r.file_ids(), vec!["m2", "own"]);
}

/// A worker with the keys signs the chunks of its own cross-key renames,
/// and applies them when it reads them back (source and destination share
/// this partition). Without keys, an unsigned chunk is applied as before.
#[test]
fn a_workers_own_cross_key_rename_is_signed_and_applied() {
    for signing in [Some(keys(KEY)), None] {
        let r = Rig::new(|c| {
            c.kafka.signing = signing.clone();
            c.commit_quiet = Duration::from_millis(20);
        });
        r.produce(upsert("r", "/z/r.txt"));
        r.produce(Command::RenamePath { from: "/z/r.txt".into(), to: "/w/r.txt".into() });
        let run = r.start();
        eventually("the rename's chunk is in the log and applied", || r.end() == 3 && run.next() == 3);
        assert_eq!(run.stop(), 3);
        assert_eq!(r.files(), vec![("r".to_string(), "/w/r.txt".to_string())], "signing {signing:?}: {:?}", r.letters());
        let chunk = r.log.lock().unwrap().records[2].clone();
        assert_eq!(chunk.signature.is_some(), signing.is_some());
        if let Some(s) = &signing {
            let sig = chunk.signature.as_deref();
            assert_eq!(s.check("t", chunk.key(), chunk.payload().unwrap(), sig), crate::signing::Provenance::Signed);
        }
    }
}
