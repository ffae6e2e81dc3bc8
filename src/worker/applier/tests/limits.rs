//! Messages over the topics' size limit (issue 29, 5): a letter or a move's
//! chunk the broker refuses for its size fails for good, and used to be
//! retried for ever, holding its partition.

use super::*;

#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs --features failpoints")]
fn a_letter_over_the_topics_limit_is_written_without_its_command() {
    #[cfg(feature = "failpoints")]
    {
        let r = Rig::new(|c| c.max_attempts = 1);
        r.outbox.limit.store(2000, Ordering::SeqCst);
        let faults = tempfile::tempdir().unwrap();
        fault(faults.path(), "index.reject", "/big\n");
        let big = r.produce(Command::UpsertFile { id: "big".into(), path: "/big/f.txt".into(), contents: "x".repeat(3000), previous_path: None });
        let after = r.produce(upsert("a", "/a/a.txt"));
        let run = r.start();
        run.wait_next(after + 1);
        assert_eq!(run.stop(), after + 1);
        assert_eq!(r.letters(), vec![Sent { reason: "index_rejected".into(), origin_offset: big, key: "/big".into() }]);
        let omitted = r.outbox.omitted.lock().unwrap().clone();
        assert_eq!(omitted.len(), 1);
        assert_eq!(omitted[0].0, big);
        assert!(omitted[0].1 > 3000, "the command's size: {omitted:?}");
        assert_eq!(r.file_ids(), vec!["a"]);
    }
}

#[test]
fn a_chunk_over_the_topics_limit_gives_its_rename_up_and_the_partition_goes_on() {
    let r = Rig::new(|c| c.max_attempts = 2);
    r.produce(Command::UpsertFile { id: "small".into(), path: "/s/a/small.txt".into(), contents: "s".into(), previous_path: None });
    r.produce(Command::UpsertFile { id: "big".into(), path: "/s/a/big.txt".into(), contents: "x".repeat(3000), previous_path: None });
    r.outbox.limit.store(2000, Ordering::SeqCst);
    let rename = r.produce(Command::RenamePath { from: "/s/a".into(), to: "/t/a".into() });
    r.start().rename_given_up(&r, rename, "index_rejected");
    let ids = r.file_ids();
    assert_eq!(ids, vec!["big", "later", "small"], "nothing lost");
}
