//! The producer library: typed commands in, (partition, offset) out. The key
//! is derived from the command, so a caller cannot get the ordering domain
//! wrong; settings are idempotent with `acks=all`.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;

use crate::codec::registry::{Registry, RegistryError};
use crate::codec::Codec;
use crate::command::{expand_owner_changes, Command, CommandError, Envelope, LogPosition};
use crate::kafka::KafkaConfig;

#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("invalid command: {0}")]
    Invalid(#[from] CommandError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A cross-key command (a rename across top-level directories, or the
    /// delete half of an owner change) was sent but its source did not
    /// apply it in time: the commands after it were not sent.
    #[error(transparent)]
    Barrier(Box<BarrierMissed>),
    /// A command of the other family than the schema registered for the
    /// producer's registry framing (a compiled-in command on a model's
    /// subject, or the reverse).
    #[error("{0}")]
    Framing(String),
}

/// A barrier's command was sent but not applied at its source in time.
#[derive(Debug, thiserror::Error)]
#[error("{what} (partition {partition}, offset {offset}) was sent, but group {group} did not apply it at its source in time: {source}; the {unsent} command(s) after it were not sent")]
pub struct BarrierMissed {
    pub what: String,
    pub partition: i32,
    pub offset: i64,
    pub group: String,
    pub unsent: usize,
    pub source: crate::kafka::WaitError,
}

impl ProduceError {
    pub fn is_retryable(&self) -> bool {
        match self {
            ProduceError::Kafka(_) => true,
            ProduceError::Registry(e) => e.is_retryable(),
            ProduceError::Invalid(_) | ProduceError::Framing(_) => false,
            ProduceError::Barrier(_) => true,
        }
    }
}

/// How long [`Producer::send_ordered`] waits for the group at its
/// barriers: each barrier at most `per_barrier`, and none past `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    pub per_barrier: Duration,
    pub until: Option<std::time::Instant>,
}

impl Patience {
    /// At most `d` for the whole call: barriers share it (`--wait`).
    pub fn within(d: Duration) -> Self {
        Patience { per_barrier: d, until: Some(std::time::Instant::now() + d) }
    }

    /// What the next wait may take.
    pub fn left(&self) -> Duration {
        match self.until {
            Some(t) => self.per_barrier.min(t.saturating_duration_since(std::time::Instant::now())),
            None => self.per_barrier,
        }
    }
}

impl From<Duration> for Patience {
    /// At most `d` per barrier.
    fn from(d: Duration) -> Self {
        Patience { per_barrier: d, until: None }
    }
}

/// How messages are framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Avro single-object encoding (`C3 01` + fingerprint): the default.
    SingleObject,
    /// Confluent Schema Registry framing with this schema id.
    Registry(u32),
}

pub struct Producer {
    inner: FutureProducer,
    topic: String,
    codec: Codec,
    framing: Framing,
}

impl Producer {
    pub fn new(cfg: &KafkaConfig) -> Result<Self, ProduceError> {
        // Java's default partitioner, so producers in any language agree on
        // the partition of a key.
        let c = cfg.producer_config(&[("partitioner", "murmur2_random"), ("linger.ms", "5"), ("compression.type", "lz4"), ("message.timeout.ms", "120000")]);
        Ok(Producer { inner: c.create()?, topic: cfg.topic.clone(), codec: Codec::new(), framing: Framing::SingleObject })
    }

    /// Also writes the commands of `model`, in single-object encoding with
    /// its schema (set it before [`Producer::with_registry`]).
    pub fn with_model(mut self, model: &'static crate::domain::Domain) -> Self {
        self.codec = Codec::new().with_model(model);
        self
    }

    /// Writes schema-registry framing: the id of the schema it writes (the
    /// model's with [`Producer::with_model`], else `schemas/command.avsc`)
    /// under `subject` is looked up, and registered first when `register`
    /// is set and the registry does not have it. The commands it sends are
    /// then of that schema only.
    pub async fn with_registry(mut self, registry: &Registry, subject: &str, register: bool) -> Result<Self, ProduceError> {
        let schema = self.codec.model_schema_text().unwrap_or(crate::codec::CURRENT_SCHEMA);
        self.framing = Framing::Registry(registry.id_for(subject, schema, register).await?);
        Ok(self)
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The message bytes of `e` in this producer's framing.
    pub fn payload(&self, e: &Envelope) -> Result<Vec<u8>, ProduceError> {
        match self.framing {
            Framing::SingleObject => Ok(self.codec.encode(e)),
            Framing::Registry(id) => {
                let model = crate::command::generic::bound::Bound::model_envelope(e).is_some();
                match self.codec.model() {
                    Some(d) if !model => {
                        Err(ProduceError::Framing(format!("a compiled-in command ({}) on a producer of model {}'s schema-registry framing: its schema id is the model's", e.command.key(), d.name)))
                    }
                    None if model => {
                        Err(ProduceError::Framing(format!("a model's command ({}) on a producer of the compiled-in schema's registry framing: give the producer the model", e.command.key())))
                    }
                    _ => Ok(crate::codec::registry::frame(id, &self.codec.datum(e))),
                }
            }
        }
    }

    /// Validates and sends one command.
    pub async fn send(&self, command: Command) -> Result<LogPosition, ProduceError> {
        command.validate_scoped()?;
        self.send_envelope(&Envelope::new(command)).await
    }

    /// Sends a command with a caller-made envelope. The command is validated.
    pub async fn send_envelope(&self, e: &Envelope) -> Result<LogPosition, ProduceError> {
        e.validate()?;
        let ack = self.enqueue(e).await?;
        ack.await
    }

    /// Hands the command to the client (in call order, which is log order per
    /// key) and returns the future of its acknowledgement.
    async fn enqueue(&self, e: &Envelope) -> Result<impl std::future::Future<Output = Result<LogPosition, ProduceError>>, ProduceError> {
        let payload = self.payload(e)?;
        let key = e.command.key();
        loop {
            // No Kafka headers: the envelope carries the id and the type, and
            // headers make fetches quadratic on tansu 0.6 (its header table
            // has no index).
            let record = FutureRecord::to(&self.topic).key(key).payload(&payload);
            match self.inner.send_result(record) {
                Ok(ack) => {
                    return Ok(async move {
                        match ack.await {
                            Ok(Ok(d)) => Ok(LogPosition { partition: d.partition, offset: d.offset }),
                            Ok(Err((e, _))) => Err(e.into()),
                            Err(_) => Err(rdkafka::error::KafkaError::Canceled.into()),
                        }
                    })
                }
                Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), _)) => {
                    // The client's queue is full: let deliveries drain.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }

    /// Sends every command (all validated first: nothing is sent when one is
    /// invalid), keeping at most `in_flight` unacknowledged, and calls
    /// `progress` with the number acknowledged so far. An owner change is
    /// sent as its two halves ([`expand_owner_changes`]), without
    /// waiting between them ([`Producer::send_ordered`] waits). Deliveries
    /// are returned in the order of the commands sent, and the log order of
    /// the commands of one key is that order.
    pub async fn send_all(&self, commands: Vec<Command>, in_flight: usize, progress: impl FnMut(usize)) -> Result<Vec<LogPosition>, ProduceError> {
        self.send_expanded(expand_owner_changes(commands), None, in_flight, progress).await
    }

    /// [`Producer::send_all`] of commands whose owner changes are expanded;
    /// the first one's envelope says it follows `first_after` (see
    /// [`Envelope::after`]).
    async fn send_expanded(&self, commands: Vec<Command>, first_after: Option<LogPosition>, in_flight: usize, mut progress: impl FnMut(usize)) -> Result<Vec<LogPosition>, ProduceError> {
        for c in &commands {
            c.validate_scoped()?;
        }
        let n = commands.len();
        let mut out = vec![LogPosition { partition: -1, offset: -1 }; n];
        let mut pending = FuturesUnordered::new();
        let mut done = 0;
        let mut record = |i: usize, r: Result<LogPosition, ProduceError>, done: &mut usize| -> Result<(), ProduceError> {
            out[i] = r?;
            *done += 1;
            if done.is_multiple_of(1000) || *done == n {
                progress(*done);
            }
            Ok(())
        };
        for (i, c) in commands.into_iter().enumerate() {
            while pending.len() >= in_flight.max(1) {
                let (j, r) = pending.next().await.expect("pending is not empty");
                record(j, r, &mut done)?;
            }
            let mut e = Envelope::new(c);
            if i == 0 {
                e.after = first_after;
            }
            let ack = self.enqueue(&e).await?;
            pending.push(async move { (i, ack.await) });
        }
        while let Some((j, r)) = pending.next().await {
            record(j, r, &mut done)?;
        }
        Ok(out)
    }

    /// Sends `commands` like [`Producer::send_all`], except that a command
    /// spanning two ordering keys is a barrier: a rename across them, and
    /// the delete half of an owner change. It is acknowledged only
    /// once `group` has applied it at its source (a rename hands its
    /// documents to the destination's partition then), and only then are
    /// the commands after it sent. So every command after it, of either
    /// key, is applied against its result. Waits as `patience` allows. The upsert after an owner change's delete carries the
    /// delete's place in the log ([`Envelope::after`]): a replay applies
    /// the two in the same order.
    ///
    /// Returns the deliveries in the order sent and, for read-your-writes
    /// across keys ([`crate::kafka::wait_for_deliveries`]), the end of each
    /// destination partition as of its move: once the group has passed
    /// those too, the moved documents are applied at the destination.
    pub async fn send_ordered(
        &self,
        kafka: &KafkaConfig,
        group: &str,
        commands: Vec<Command>,
        in_flight: usize,
        patience: impl Into<Patience>,
        mut progress: impl FnMut(usize),
    ) -> Result<(Vec<LogPosition>, Vec<LogPosition>), ProduceError> {
        let patience = patience.into();
        let commands = expand_owner_changes(commands);
        for c in &commands {
            c.validate_scoped()?;
        }
        let n = commands.len();
        let mut out = Vec::with_capacity(n);
        let mut destinations = Vec::new();
        let mut rest = commands;
        // The delete half of the owner change whose upsert comes next.
        let mut departed: Option<LogPosition> = None;
        while !rest.is_empty() {
            let found = (0..rest.len()).find_map(|i| barrier(&rest, i).map(|b| (i, b)));
            let cut = found.as_ref().map_or(rest.len(), |(i, _)| i + 1);
            let what = found.map(|(_, b)| b);
            let after = rest.split_off(cut);
            let segment = std::mem::replace(&mut rest, after);
            let sent = out.len();
            out.extend(self.send_expanded(segment, departed.take(), in_flight, |done| progress(sent + done)).await?);
            let Some(what) = what else { continue };
            let d = *out.last().expect("the barrier was sent");
            if what.destination.is_none() {
                departed = Some(LogPosition { partition: d.partition, offset: d.offset });
            }
            let (cfg, g) = (kafka.clone(), group.to_string());
            let dest_key = what.destination.clone();
            let timeout = patience.left();
            let waited = tokio::task::spawn_blocking(move || -> Result<Option<LogPosition>, crate::kafka::WaitError> {
                crate::kafka::wait_for_deliveries(&cfg, &g, &[d], timeout)?;
                let Some(dest_key) = dest_key else { return Ok(None) };
                // The destination's chunks are in its partition now.
                let dest = crate::command::partitioner::partition_of(&dest_key, cfg.topic_partitions().map_err(crate::kafka::WaitError::Kafka)?.unwrap_or(1));
                let lag = crate::kafka::group_lag(&cfg, &g).map_err(crate::kafka::WaitError::Kafka)?;
                Ok(lag.partitions.iter().find(|p| p.partition == dest && p.end > 0).map(|p| LogPosition { partition: dest, offset: p.end - 1 }))
            })
            .await
            .expect("wait task");
            match waited {
                Ok(dest) => destinations.extend(dest),
                Err(source) => {
                    return Err(ProduceError::Barrier(Box::new(BarrierMissed {
                        what: what.description,
                        partition: d.partition,
                        offset: d.offset,
                        group: group.to_string(),
                        unsent: rest.len(),
                        source,
                    })));
                }
            }
        }
        Ok((out, destinations))
    }

    /// Waits until everything sent has been acknowledged.
    pub fn flush(&self) -> Result<(), ProduceError> {
        self.inner.flush(Timeout::After(Duration::from_secs(120)))?;
        Ok(())
    }
}

/// A command [`Producer::send_ordered`] waits for before sending more.
struct Barrier {
    /// For errors: what was sent.
    description: String,
    /// For a rename across keys: the destination key, whose partition the
    /// moved documents are written to.
    destination: Option<String>,
}

fn delete_id(c: &Command) -> &str {
    match c {
        Command::DeleteFile { id, .. } | Command::DeletePost { id, .. } => id,
        _ => "",
    }
}

/// Whether `commands[i]` is a barrier: a rename across ordering keys, or
/// the delete right before the upsert that gives its document another
/// owner (as [`expand_owner_changes`] puts them).
fn barrier(commands: &[Command], i: usize) -> Option<Barrier> {
    match (&commands[i], commands.get(i + 1)) {
        (c @ Command::RenamePath { from, to }, _) if c.destination_key().is_some() => {
            Some(Barrier { description: format!("the cross-key rename {from:?} -> {to:?}"), destination: c.destination_key().map(str::to_string) })
        }
        (delete, Some(next)) if next.owner_change_delete().as_ref() == Some(delete) => {
            Some(Barrier { description: format!("the {} of {:?} under {:?}, before it goes to {:?},", delete.kind(), delete_id(delete), delete.key(), next.key()), destination: None })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_framing_writes_only_the_family_of_the_schema_it_registered() {
        let files = crate::command::generic::legacy::domain();
        let compiled = Envelope::new(Command::DeleteUser { id: "u1".into() });
        let model = Envelope::new(crate::command::generic::legacy::command_of(files, &compiled));
        let cfg = KafkaConfig::new("127.0.0.1:9", "t");
        let mut plain = Producer::new(&cfg).unwrap();
        let mut of_model = Producer::new(&cfg).unwrap().with_model(files);
        // Single-object framing names its schema in every message: both families.
        assert!(of_model.payload(&compiled).is_ok() && of_model.payload(&model).is_ok());
        plain.framing = Framing::Registry(41);
        of_model.framing = Framing::Registry(51);
        assert_eq!(plain.payload(&compiled).unwrap(), crate::codec::registry::frame(41, &Codec::new().datum(&compiled)));
        assert_eq!(of_model.payload(&model).unwrap(), crate::codec::registry::frame(51, &Codec::new().with_model(files).datum(&model)));
        let e = of_model.payload(&compiled).unwrap_err();
        assert!(matches!(e, ProduceError::Framing(_)) && e.to_string().contains("model files_and_posts"), "{e}");
        assert!(matches!(plain.payload(&model), Err(ProduceError::Framing(_))));
    }
}
