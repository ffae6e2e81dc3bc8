//! The fence of a tenant moving from the shared indexes into indexes of
//! its own (`denorm rebuild --tenant T`, T named in
//! `DENORM_ES_DEDICATED_TENANTS`; see docs/tenants.md, "Moving a tenant").
//!
//! The live workers write a shared tenant through the shared write alias,
//! which no fence can take from one tenant. Instead:
//!
//! 1. the placement records the tenant as dedicated and entering: a
//!    writer that reads it writes the tenant through its own write alias,
//!    which is on no index until the cutover (its writes of the tenant
//!    wait, like those of a fenced dedicated tenant);
//! 2. a `PLACE` control message to every partition makes each live writer
//!    opened before reopen, reading the placement afresh;
//! 3. every writer that opens a shard says in the index which placement it
//!    writes with; the fence holds once the writer of every partition
//!    says it writes with this one. Nothing of the tenant reaches the
//!    shared indexes from then on, and the rebuild applies the log up to
//!    its end as read after that.

use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord};
use tracing::info;

use super::RebuildError;
use crate::command::control::{Action, Control};
use crate::index::tenant_generations::TenantGenerations;
use crate::kafka::{KafkaConfig, KafkaSetupError};

/// How often the writers' word is read while the fence waits for it.
const POLL: Duration = Duration::from_millis(200);

/// How often the partitions still waited for are logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Fences the live workers off the shared indexes for the tenant moving
/// into revision `rev` of its own (steps 1 to 3 above). Blocking; resumed,
/// it records nothing twice.
pub(super) fn fence(index: &TenantGenerations, kafka: &KafkaConfig, partitions: i32, rev: u64, runtime: &tokio::runtime::Handle) -> Result<(), RebuildError> {
    let moves = index.fence_entering(rev)?;
    info!(tenant = %index.tenant, moves, "the placement records the tenant as moving into indexes of its own: telling the live writer of every partition");
    crate::faults::hold("rebuild.placed");
    announce(kafka, partitions, index, moves, runtime)?;
    let mut logged = Instant::now();
    let mut waited = false;
    loop {
        let behind = index.unacknowledged(moves, partitions)?;
        if behind.is_empty() {
            return Ok(());
        }
        if !std::mem::replace(&mut waited, true) {
            crate::faults::reached("rebuild.awaits-acks");
        }
        if logged.elapsed() >= LOG_EVERY {
            info!(tenant = %index.tenant, partitions = ?behind, "waiting for the live writers of these partitions to take the placement (a worker that has not read its PLACE message yet, is down, or is older than PLACE and dead-letters it: upgrade it)");
            logged = Instant::now();
        }
        std::thread::sleep(POLL);
    }
}

/// Writes a `PLACE` control message for the tenant's move (the placement's
/// count of moves: `moves`) to every partition of the topic, acknowledged.
fn announce(kafka: &KafkaConfig, partitions: i32, index: &TenantGenerations, moves: u64, runtime: &tokio::runtime::Handle) -> Result<(), RebuildError> {
    let producer: FutureProducer = kafka.producer_config(&[("message.timeout.ms", "120000")]).create().map_err(KafkaSetupError::from)?;
    let c = Control {
        action: Action::Place,
        // Keyless, as the message is: it concerns no key (a dead letter
        // of it, by a worker older than PLACE, parks none).
        key: String::new(),
        dlq_partition: -1,
        dlq_offset: -1,
        through: i64::try_from(moves).unwrap_or(i64::MAX),
        // The generation whose placement changed.
        origin_offset: i64::try_from(index.shared).unwrap_or(i64::MAX),
        payload: Vec::new(),
        requested_at: crate::clock::now_millis(),
        through_at: -1,
    };
    let bytes = crate::codec::Codec::new().encode_control(&c);
    let sent: Result<(), rdkafka::error::KafkaError> = runtime.block_on(async {
        let mut acks = Vec::new();
        for p in 0..partitions {
            let headers = crate::signing::headers(kafka.signing.as_deref(), &kafka.topic, None, &bytes);
            let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&kafka.topic).partition(p).payload(&bytes[..]).headers(headers);
            acks.push(producer.send_result(record).map_err(|(e, _)| e)?);
        }
        for ack in acks {
            match ack.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(e),
                Err(_) => return Err(rdkafka::error::KafkaError::Canceled),
            }
        }
        Ok(())
    });
    sent.map_err(|e| RebuildError::Kafka(e.into()))
}
