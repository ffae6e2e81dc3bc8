//! Every metric denorm exports: name, unit and description in one place.
//! Names follow `denorm_<subsystem>_<thing>_<unit>`; counters end in
//! `_total`; labels are low-cardinality (partition, command type, outcome).

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const CONSUMER_LAG_MESSAGES: &str = "denorm_consumer_lag_messages";
pub const CONSUMER_LAG_SECONDS: &str = "denorm_consumer_lag_seconds";
pub const UNAPPLIED_COMMANDS: &str = "denorm_partition_unapplied_commands";
pub const COMMANDS_TOTAL: &str = "denorm_commands_total";
pub const COMMAND_DOCUMENTS: &str = "denorm_command_documents";
pub const COMMAND_SECONDS: &str = "denorm_command_apply_seconds";
pub const INDEX_COMMIT_SECONDS: &str = "denorm_index_commit_seconds";
pub const INDEX_RETRIES_TOTAL: &str = "denorm_index_retries_total";
pub const REBALANCES_TOTAL: &str = "denorm_consumer_rebalances_total";
pub const ASSIGNED_PARTITIONS: &str = "denorm_consumer_assigned_partitions";
pub const REBALANCE_SECONDS: &str = "denorm_consumer_rebalance_seconds";
pub const GROUP_REJOINS_TOTAL: &str = "denorm_consumer_group_rejoins_total";
pub const OFFSET_COMMITS_TOTAL: &str = "denorm_consumer_offset_commits_total";
pub const OFFSET_COMMIT_FAILURES_TOTAL: &str = "denorm_consumer_offset_commit_failures_total";
pub const PARTITION_PAUSES_TOTAL: &str = "denorm_consumer_partition_pauses_total";
pub const PARTITION_PAUSED_SECONDS: &str = "denorm_consumer_partition_paused_seconds";
pub const MESSAGES_REJECTED_TOTAL: &str = "denorm_messages_rejected_total";
pub const DEAD_LETTERS_TOTAL: &str = "denorm_dead_letters_total";
pub const DEAD_LETTER_RETRIES_TOTAL: &str = "denorm_dead_letter_retries_total";
pub const PARKED_KEYS: &str = "denorm_parked_keys";
pub const PARKING_REFUSED_TOTAL: &str = "denorm_parking_refused_total";
pub const PARTITION_FETCH_STALLED: &str = "denorm_partition_fetch_stalled";
pub const DEGRADED_PARTITIONS: &str = "denorm_degraded_partitions";
pub const PARTITION_STOPPED: &str = "denorm_partition_stopped";
pub const ES_BULK_SECONDS: &str = "denorm_es_bulk_request_seconds";
pub const ES_BULK_ITEMS_TOTAL: &str = "denorm_es_bulk_items_total";
pub const ES_RETRIES_TOTAL: &str = "denorm_es_retries_total";
pub const ES_PIT_PAGES_TOTAL: &str = "denorm_es_pit_pages_total";
pub const SCHEMA_REGISTRY_REQUESTS_TOTAL: &str = "denorm_schema_registry_requests_total";
pub const MOVES_TOTAL: &str = "denorm_moves_total";
pub const MOVES_IN_FLIGHT: &str = "denorm_moves_in_flight";
pub const MOVES_WAITING: &str = "denorm_moves_waiting_messages";
pub const MOVE_SECONDS: &str = "denorm_move_seconds";
pub const OWNER_CONFLICTS: &str = "denorm_owner_conflicts";
pub const TAKEOVERS_WAITING: &str = "denorm_takeovers_waiting";
pub const TAKEOVER_WAITS_TOTAL: &str = "denorm_takeover_waits_total";
pub const OWNER_CONFLICTS_TOTAL: &str = "denorm_owner_conflicts_total";
pub const WAITING_COMMANDS: &str = "denorm_partition_waiting_commands";
pub const OLDEST_UNFINISHED_SECONDS: &str = "denorm_partition_oldest_unfinished_seconds";
pub const PARTITION_BUSY_LANES: &str = "denorm_partition_busy_lanes";
pub const PARTITION_HELD_MESSAGES: &str = "denorm_partition_held_messages";
pub const PARTITION_SPILLED_MESSAGES: &str = "denorm_partition_spilled_messages";
pub const LANE_FAN_OUTS: &str = "denorm_lane_fan_outs";
pub const REPAIRS_TOTAL: &str = "denorm_repairs_total";
pub const VERIFY_LAST_RUN: &str = "denorm_verify_last_run_timestamp_seconds";
pub const VERIFY_LAST_CLEAN: &str = "denorm_verify_last_clean_timestamp_seconds";
pub const VERIFY_CHECKED: &str = "denorm_verify_documents_checked";
pub const VERIFY_DIFFERENCES: &str = "denorm_verify_differences";
pub const VERIFY_SECONDS: &str = "denorm_verify_duration_seconds";
pub const VERIFY_NOT_COMPARED: &str = "denorm_verify_documents_not_compared";
pub const WORKER_SETTINGS_MISMATCH: &str = "denorm_worker_settings_mismatch";

/// Every metric name above (the dashboard check reads this).
pub mod tenants;

pub const ALL: &[&str] = &[
    tenants::COMMANDS_TOTAL,
    tenants::FAN_OUT_DOCUMENTS_TOTAL,
    tenants::DEAD_LETTERS_TOTAL,
    tenants::APPLY_DELAY_SECONDS,
    CONSUMER_LAG_MESSAGES,
    CONSUMER_LAG_SECONDS,
    UNAPPLIED_COMMANDS,
    COMMANDS_TOTAL,
    COMMAND_DOCUMENTS,
    COMMAND_SECONDS,
    INDEX_COMMIT_SECONDS,
    INDEX_RETRIES_TOTAL,
    REBALANCES_TOTAL,
    ASSIGNED_PARTITIONS,
    REBALANCE_SECONDS,
    GROUP_REJOINS_TOTAL,
    OFFSET_COMMITS_TOTAL,
    OFFSET_COMMIT_FAILURES_TOTAL,
    PARTITION_PAUSES_TOTAL,
    PARTITION_PAUSED_SECONDS,
    MESSAGES_REJECTED_TOTAL,
    DEAD_LETTERS_TOTAL,
    DEAD_LETTER_RETRIES_TOTAL,
    PARKED_KEYS,
    PARKING_REFUSED_TOTAL,
    PARTITION_FETCH_STALLED,
    DEGRADED_PARTITIONS,
    PARTITION_STOPPED,
    ES_BULK_SECONDS,
    ES_BULK_ITEMS_TOTAL,
    ES_RETRIES_TOTAL,
    ES_PIT_PAGES_TOTAL,
    SCHEMA_REGISTRY_REQUESTS_TOTAL,
    MOVES_TOTAL,
    MOVES_IN_FLIGHT,
    MOVES_WAITING,
    MOVE_SECONDS,
    OWNER_CONFLICTS,
    OWNER_CONFLICTS_TOTAL,
    TAKEOVERS_WAITING,
    TAKEOVER_WAITS_TOTAL,
    WAITING_COMMANDS,
    OLDEST_UNFINISHED_SECONDS,
    PARTITION_BUSY_LANES,
    PARTITION_HELD_MESSAGES,
    PARTITION_SPILLED_MESSAGES,
    LANE_FAN_OUTS,
    REPAIRS_TOTAL,
    VERIFY_LAST_RUN,
    VERIFY_LAST_CLEAN,
    VERIFY_CHECKED,
    VERIFY_DIFFERENCES,
    VERIFY_SECONDS,
    VERIFY_NOT_COMPARED,
    WORKER_SETTINGS_MISMATCH,
];

/// Names that are histograms (exported as `_bucket`, `_sum`, `_count`).
pub const HISTOGRAMS: &[&str] = &[COMMAND_DOCUMENTS, COMMAND_SECONDS, INDEX_COMMIT_SECONDS, ES_BULK_SECONDS, MOVE_SECONDS, tenants::APPLY_DELAY_SECONDS];

/// Outcomes of a command (label `outcome` of [`COMMANDS_TOTAL`]).
pub mod outcome {
    /// Applied to the index.
    pub const APPLIED: &str = "applied";
    /// Already applied before (redelivery); skipped.
    pub const DUPLICATE: &str = "duplicate";
    /// Could not be decoded; dead-lettered.
    pub const UNDECODABLE: &str = "undecodable";
    /// Decoded but invalid; dead-lettered.
    pub const INVALID: &str = "invalid";
    /// Rejected by the index `--max-attempts` times; dead-lettered.
    pub const FAILED: &str = "failed";
    /// Its key is parked behind an aborted command; dead-lettered.
    pub const PARKED: &str = "parked";
    /// An operator's control message (`denorm dlq`), carried out.
    pub const CONTROL: &str = "control";
}

fn describe() {
    describe_gauge!(CONSUMER_LAG_MESSAGES, Unit::Count, "Messages in the partition not yet applied (end offset minus next offset to apply).");
    describe_gauge!(UNAPPLIED_COMMANDS, Unit::Count, "Messages in the partition not applied yet: the lag in offsets less the commands key lanes applied above the group's offset (issue 45). During a fan-out in its lane, the lag in offsets counts every later message; this counts the fan-out and what waits for it.");
    describe_gauge!(CONSUMER_LAG_SECONDS, Unit::Seconds, "Age of the oldest fetched message of the partition not yet applied; 0 when caught up.");
    describe_counter!(COMMANDS_TOTAL, Unit::Count, "Commands handled, by type and outcome.");
    describe_histogram!(COMMAND_DOCUMENTS, Unit::Count, "Documents written per command, by type.");
    describe_histogram!(COMMAND_SECONDS, Unit::Seconds, "Time to apply one command (before the index commit), by type.");
    describe_histogram!(INDEX_COMMIT_SECONDS, Unit::Seconds, "Latency of durable index commits.");
    describe_counter!(INDEX_RETRIES_TOTAL, Unit::Count, "Index operations retried after a transient failure.");
    describe_counter!(REBALANCES_TOTAL, Unit::Count, "Consumer-group rebalances seen, by kind (assign, revoke).");
    describe_gauge!(ASSIGNED_PARTITIONS, Unit::Count, "Partitions currently assigned to this worker.");
    describe_gauge!(REBALANCE_SECONDS, Unit::Seconds, "How long the group's rebalance in progress has taken (0: none); past the session timeout a warning is logged.");
    describe_counter!(GROUP_REJOINS_TOTAL, Unit::Count, "Times this worker left the group and joined it again, having held no partition past the session timeout while the group had lag.");
    describe_counter!(
        MESSAGES_REJECTED_TOTAL,
        Unit::Count,
        "Messages not applied, by reason (empty_payload, oversized, not_single_object, unknown_schema, undecodable, invalid_command, missing_key, key_mismatch, invalid_tenant)."
    );
    describe_counter!(DEAD_LETTERS_TOTAL, Unit::Count, "Messages written to the dead-letter topic, by reason (the rejection reasons, index_rejected, parked, repair_refused).");
    describe_counter!(
        REPAIRS_TOTAL,
        Unit::Count,
        "Repairs sent by `denorm verify --repair`, by outcome (applied: their document was unchanged since the verify; refused: written since, dead-lettered as repair_refused; superseded: a later command of its partition wrote the document already, a redelivery after a crash, skipped without a letter)."
    );
    describe_gauge!(VERIFY_LAST_RUN, Unit::Seconds, "When the index's last `denorm verify` finished (Unix time), as recorded in the index; exported by every worker.");
    describe_gauge!(VERIFY_LAST_CLEAN, Unit::Seconds, "When a `denorm verify` of the index last found no difference (Unix time); 0 when none has been, absent until a verify has run.");
    describe_gauge!(VERIFY_CHECKED, Unit::Count, "Documents the last `denorm verify` compared.");
    describe_gauge!(VERIFY_DIFFERENCES, Unit::Count, "Documents the last `denorm verify` found different from the replay of the log (with --repair: those left after it).");
    describe_gauge!(VERIFY_SECONDS, Unit::Seconds, "How long the last `denorm verify` took.");
    describe_gauge!(
        VERIFY_NOT_COMPARED,
        Unit::Count,
        "Documents the last `denorm verify` did not compare, by reason: written_since (written after its offsets) and unsettled (lacking in a partition whose log went on)."
    );
    describe_gauge!(
        WORKER_SETTINGS_MISMATCH,
        Unit::Count,
        "1 while this worker's settings that decide what it applies (abort policy, message size limit, schema registry, partitioner rule, attempts) differ from those recorded in the index by the last worker started; verify and rebuild replay with the recorded ones."
    );
    describe_counter!(DEAD_LETTER_RETRIES_TOTAL, Unit::Count, "Failed writes to the dead-letter topic, retried (nothing is committed past them meanwhile).");
    describe_gauge!(PARKED_KEYS, Unit::Count, "Keys of the partition parked behind an aborted command, waiting for `denorm dlq reprocess` or `clear`.");
    describe_gauge!(
        PARTITION_FETCH_STALLED,
        Unit::Count,
        "1 while the consumer reads nothing of the partition although the broker holds more and nothing waits for its applier (a batch it cannot fetch or decode)."
    );
    describe_counter!(
        PARKING_REFUSED_TOTAL,
        Unit::Count,
        "Aborted commands whose key was not parked because the partition parks --max-parked-keys keys already: their keys' later commands are applied."
    );
    describe_gauge!(DEGRADED_PARTITIONS, Unit::Count, "Partitions retrying a transient failure (index or dead-letter topic unavailable); /readyz fails while it is above 0.");
    describe_gauge!(PARTITION_STOPPED, Unit::Count, "1 while the partition is stopped because retention deleted commands its shard never applied (a gap that is never skipped); 0 once revoked.");
    describe_histogram!(ES_BULK_SECONDS, Unit::Seconds, "Latency of Elasticsearch bulk requests.");
    describe_counter!(ES_BULK_ITEMS_TOTAL, Unit::Count, "Elasticsearch bulk items by outcome (done, conflict, retry, failed).");
    describe_counter!(ES_PIT_PAGES_TOTAL, Unit::Count, "Point-in-time pages read from Elasticsearch.");
    describe_counter!(ES_RETRIES_TOTAL, Unit::Count, "Elasticsearch retries by reason (request, items).");
    describe_counter!(SCHEMA_REGISTRY_REQUESTS_TOTAL, Unit::Count, "Schema-registry requests for schema ids not cached yet, by outcome (found, not_found, error).");
    describe_counter!(PARTITION_PAUSES_TOTAL, Unit::Count, "Partitions paused because their applier's queue was full (--queue-kb); resumed at half.");
    describe_histogram!(
        PARTITION_PAUSED_SECONDS,
        Unit::Seconds,
        "How long each pause of a partition whose applier's queue was full lasted, until it was resumed: the time the consumer was held back by the applier."
    );
    describe_counter!(
        MOVES_TOTAL,
        Unit::Count,
        "Cross-key renames, by side and outcome: source sent (documents written to the destination, then deleted here), destination completed, destination duplicate (a resend of a completed move, ignored)."
    );
    describe_gauge!(MOVES_IN_FLIGHT, Unit::Count, "1 while the partition is applying a cross-key move that spans several messages (its first chunk applied, its last not yet).");
    describe_gauge!(MOVES_WAITING, Unit::Count, "Messages of the partition passed over while the cross-key move in flight is received (read again once it ends).");
    describe_histogram!(MOVE_SECONDS, Unit::Seconds, "Time from a cross-key rename's issue to its documents being applied at the destination.");
    describe_gauge!(TAKEOVERS_WAITING, Unit::Count, "1 while the partition waits to take a document over (a cross-key move's first chunk, an owner change's upsert) until the partition it leaves has applied its log up to the departure: a replay or rebuild running partitions at their own pace. Live, the producer's barrier makes this immediate.");
    describe_counter!(TAKEOVER_WAITS_TOTAL, Unit::Count, "Take-overs that had to wait for the partition their documents leave (see denorm_takeovers_waiting).");
    describe_gauge!(OWNER_CONFLICTS, Unit::Count, "Embedded index: documents held under more than one key in two owner audits in a row (an owner change sent without its explicit form).");
    describe_counter!(OWNER_CONFLICTS_TOTAL, Unit::Count, "Commands not applied because another key's partition holds their document (an owner change sent without its explicit form, a delete naming the wrong key, or a write of a key the document left, redelivered or replayed): any write on Elasticsearch, a delete on the embedded index.");
    describe_gauge!(
        WAITING_COMMANDS,
        Unit::Count,
        "Messages fetched for the partition that wait for its applier (queued, waiting in a key's lane behind its fan-out, or held while the partition is paused), not counting those being applied."
    );
    describe_gauge!(OLDEST_UNFINISHED_SECONDS, Unit::Seconds, "How long the partition's oldest unfinished command has run (a fan-out in a key lane, or the command being applied, retries and commit included); 0 when idle. With denorm_partition_waiting_commands above 0 and busy lanes at --lanes (or --lanes 1), other keys wait behind it.");
    describe_gauge!(LANE_FAN_OUTS, Unit::Count, "Fan-outs in key lanes in this process, all partitions: each partition may run one, and more only while fewer than --max-lane-fan-outs run (on Elasticsearch each holds a point in time and page bulks).");
    describe_gauge!(
        PARTITION_HELD_MESSAGES,
        Unit::Count,
        "A flooding tenant's messages the partition holds in memory, read ahead past so that the other tenants' messages behind them are applied first (issue 47; at most three eighths of --queue-kb)."
    );
    describe_gauge!(PARTITION_SPILLED_MESSAGES, Unit::Count, "A flooding tenant's messages past what the partition holds in memory: kept in a file until the hold has room for them (issue 47).");
    describe_gauge!(PARTITION_BUSY_LANES, Unit::Count, "Fan-outs of the partition in progress in key lanes (at most --lanes): each holds up only its own key's later commands.");
    describe_counter!(OFFSET_COMMITS_TOTAL, Unit::Count, "Offset commits sent to Kafka, by mode (async, sync).");
    describe_counter!(
        OFFSET_COMMIT_FAILURES_TOTAL,
        Unit::Count,
        "Periodic offset commits (or a partition's part of one) the broker refused, for example during a rebalance; each is sent again at the next interval."
    );
    tenants::describe();
}

/// Installs the global Prometheus recorder and returns its handle.
pub fn install() -> Result<PrometheusHandle, String> {
    let seconds = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
    let documents = [0.0, 1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, 1_000_000.0];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(COMMAND_DOCUMENTS.into()), &documents))
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
    Ok(handle)
}
