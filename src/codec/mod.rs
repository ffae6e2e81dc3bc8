//! Avro encoding of [`Envelope`]s.
//!
//! Wire format: Avro single-object encoding: `C3 01`, the 8-byte
//! little-endian CRC-64-AVRO fingerprint of the writer schema's Parsing
//! Canonical Form ([`canonical`]), then the binary datum. Every schema
//! version in `schemas/` is known to the decoder, so messages written with
//! an older compatible schema decode. Resolution follows Avro's rules:
//! record fields match by name, writer fields the reader does not know are
//! ignored, reader fields the writer lacks take their defaults, and the
//! payload union branch is chosen by record name.
//!
//! Fingerprints of earlier denorm builds (apache-avro's non-conforming
//! canonical form) are accepted as aliases of the same schema versions: the
//! topics hold them and a replay must decode them. Only the
//! specification's fingerprints are written.

pub mod canonical;
pub mod model;
pub mod registry;
mod value;

use value::{control_from_value, from_value, move_from_value};
pub use value::{record_name, to_value};

use std::collections::HashMap;

use apache_avro::rabin::Rabin;
use apache_avro::schema::Schema;
use apache_avro::types::Value;

use crate::command::control::Control;
use crate::command::moves::MoveIn;
use crate::command::Envelope;

/// The current schema (writer schema of this version).
pub const CURRENT_SCHEMA: &str = include_str!("../../schemas/command.avsc");
/// Schema of operator control messages (`denorm dlq reprocess|clear`).
pub const CONTROL_SCHEMA: &str = include_str!("../../schemas/control.avsc");
/// Schema of the documents a cross-key rename carries (written by workers).
pub const MOVE_SCHEMA: &str = include_str!("../../schemas/move.avsc");
/// Older schema versions this decoder still reads.
pub const HISTORY: &[&str] = &[
    include_str!("../../schemas/history/command-v1.avsc"),
    include_str!("../../schemas/history/command-v2.avsc"),
    include_str!("../../schemas/history/command-v3.avsc"),
    include_str!("../../schemas/history/command-v4.avsc"),
    include_str!("../../schemas/history/command-v5.avsc"),
    include_str!("../../schemas/history/command-v6.avsc"),
];
/// Older versions of the move schema this decoder still reads.
pub const MOVE_HISTORY: &[&str] = &[include_str!("../../schemas/history/move-v1.avsc")];
/// Older versions of the control schema this decoder still reads.
pub const CONTROL_HISTORY: &[&str] = &[include_str!("../../schemas/history/control-v1.avsc")];
/// Every schema file, by its path in the repository.
pub const SCHEMA_FILES: &[(&str, &str)] = &[
    ("schemas/command.avsc", CURRENT_SCHEMA),
    ("schemas/history/command-v1.avsc", HISTORY[0]),
    ("schemas/history/command-v2.avsc", HISTORY[1]),
    ("schemas/history/command-v3.avsc", HISTORY[2]),
    ("schemas/history/command-v4.avsc", HISTORY[3]),
    ("schemas/history/command-v5.avsc", HISTORY[4]),
    ("schemas/history/command-v6.avsc", HISTORY[5]),
    ("schemas/control.avsc", CONTROL_SCHEMA),
    ("schemas/history/control-v1.avsc", CONTROL_HISTORY[0]),
    ("schemas/move.avsc", MOVE_SCHEMA),
    ("schemas/history/move-v1.avsc", MOVE_HISTORY[0]),
];

const MAGIC: [u8; 2] = [0xC3, 0x01];
/// Largest single allocation the Avro decoder may make (a string or array).
const MAX_ALLOCATION: usize = 64 << 20;

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("message is {0} bytes, shorter than its framing's header (10 bytes single-object, 5 bytes schema-registry)")]
    TooShort(usize),
    #[error("message does not start with the Avro single-object marker C3 01 (found {0:02X} {1:02X})")]
    BadMarker(u8, u8),
    #[error("unknown writer schema fingerprint {0}")]
    UnknownFingerprint(String),
    #[error("undecodable Avro datum: {0}")]
    Datum(String),
    #[error("{0} trailing bytes after the Avro datum")]
    TrailingBytes(usize),
    #[error("datum does not have the shape of a denorm command: {0}")]
    Shape(String),
    /// Schema-registry framing whose id cannot be resolved for good.
    #[error("unknown schema-registry schema id {id}: {detail}")]
    UnknownSchemaId { id: u32, detail: String },
    /// The schema registry cannot be asked now (transient: retry).
    #[error("{0}")]
    RegistryUnavailable(String),
}

impl DecodeError {
    /// Whether decoding the same bytes later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, DecodeError::RegistryUnavailable(_))
    }
}

/// One known writer schema.
struct Known {
    schema: Schema,
    family: Family,
}

/// Which kind of message a schema file describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Command,
    Control,
    Move,
}

/// Encoder/decoder holding every known schema, keyed by fingerprint.
pub struct Codec {
    current: Schema,
    current_fingerprint: [u8; 8],
    control: Schema,
    control_fingerprint: [u8; 8],
    moves: Schema,
    move_fingerprint: [u8; 8],
    /// Spec fingerprints and legacy aliases of every schema file.
    known: HashMap<[u8; 8], std::sync::Arc<Known>>,
    /// Resolves schema-registry framing (`--schema-registry`).
    registry: Option<(std::sync::Arc<registry::Registry>, tokio::runtime::Handle)>,
    /// A declared model's commands (`--model`), beside the compiled-in ones.
    model: Option<(model::ModelCodec, &'static crate::domain::Domain)>,
    /// The codecs of the model's earlier versions, whose commands the topic
    /// may still hold: read with their schema, bound to the model.
    earlier: Vec<model::ModelCodec>,
}

/// A message of the command topic: a command, or an operator's control
/// message.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    Command(Envelope),
    Control(Control),
    /// A chunk of a cross-key move (see [`crate::moves`]).
    Move(MoveIn),
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

/// The fingerprints of one schema file: what denorm writes, and what
/// earlier builds wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SchemaFingerprints {
    pub file: &'static str,
    /// CRC-64-AVRO of the Parsing Canonical Form, little-endian hex (the
    /// bytes after `C3 01`).
    pub fingerprint: String,
    /// What earlier denorm builds wrote (accepted when decoding).
    pub legacy: String,
}

/// Fingerprints of every schema file.
pub fn schema_fingerprints() -> Vec<SchemaFingerprints> {
    SCHEMA_FILES.iter().map(|(file, text)| SchemaFingerprints { file, fingerprint: hex(&fingerprint_of(text)), legacy: hex(&legacy_fingerprint(&parse(text))) }).collect()
}

fn parse(text: &str) -> Schema {
    Schema::parse_str(text).expect("schemas/ are valid")
}

/// The specification's fingerprint of a schema file of this build.
fn fingerprint_of(text: &str) -> [u8; 8] {
    canonical::fingerprint(text).expect("schemas/ are valid")
}

impl Codec {
    pub fn new() -> Self {
        limit_allocations();
        let mut known = HashMap::new();
        for (_, text) in SCHEMA_FILES {
            let schema = parse(text);
            let legacy = legacy_fingerprint(&schema);
            let family = if *text == CONTROL_SCHEMA || CONTROL_HISTORY.contains(text) {
                Family::Control
            } else if *text == MOVE_SCHEMA || MOVE_HISTORY.contains(text) {
                Family::Move
            } else {
                Family::Command
            };
            let k = std::sync::Arc::new(Known { schema, family });
            known.insert(fingerprint_of(text), k.clone());
            known.insert(legacy, k);
        }
        Codec {
            current: parse(CURRENT_SCHEMA),
            current_fingerprint: fingerprint_of(CURRENT_SCHEMA),
            control: parse(CONTROL_SCHEMA),
            control_fingerprint: fingerprint_of(CONTROL_SCHEMA),
            moves: parse(MOVE_SCHEMA),
            move_fingerprint: fingerprint_of(MOVE_SCHEMA),
            known,
            registry: None,
            model: None,
            earlier: Vec::new(),
        }
    }

    /// Also writes and reads the commands of `model`, with its schema
    /// (`denorm schema --model`).
    pub fn with_model(mut self, model: &'static crate::domain::Domain) -> Self {
        self.model = Some((model::ModelCodec::new(model.clone()), model));
        self.earlier = model.earlier.iter().map(|e| model::ModelCodec::new(e.clone())).collect();
        self
    }

    /// The Avro schema of the model's commands, as `denorm schema --model`
    /// prints it.
    pub fn model_schema_text(&self) -> Option<&str> {
        self.model.as_ref().map(|(c, _)| c.schema_text())
    }

    /// The model whose commands it reads too ([`Codec::with_model`]).
    pub fn model(&self) -> Option<&'static crate::domain::Domain> {
        self.model.as_ref().map(|(_, d)| *d)
    }

    /// Also decodes schema-registry framing, resolving ids with `registry`
    /// (its requests run on `runtime`; decode from outside the runtime).
    pub fn with_registry(mut self, registry: std::sync::Arc<registry::Registry>, runtime: tokio::runtime::Handle) -> Self {
        self.registry = Some((registry, runtime));
        self
    }

    /// Fingerprint of the current writer schema (hex, as in error messages).
    pub fn current_fingerprint(&self) -> String {
        hex(&self.current_fingerprint)
    }

    /// Encodes with the current schema.
    pub fn encode(&self, envelope: &Envelope) -> Vec<u8> {
        if let Some(m) = crate::command::generic::bound::Bound::model_envelope(envelope) {
            let (codec, _) = self.model.as_ref().expect("a model's command is encoded by a codec of its model (`Codec::with_model`)");
            return codec.encode(&m);
        }
        encode_value(&self.current, self.current_fingerprint, to_value(&self.current, envelope))
    }

    /// The binary Avro datum of `envelope` under the current schema (a
    /// model's command: its model's), without any framing.
    pub fn datum(&self, envelope: &Envelope) -> Vec<u8> {
        if let Some(m) = crate::command::generic::bound::Bound::model_envelope(envelope) {
            let (codec, _) = self.model.as_ref().expect("a model's command is encoded by a codec of its model (`Codec::with_model`)");
            return codec.datum(&m);
        }
        apache_avro::to_avro_datum(&self.current, to_value(&self.current, envelope)).expect("value matches its schema")
    }

    /// Decodes a command written with any known schema version.
    pub fn decode(&self, bytes: &[u8]) -> Result<Envelope, DecodeError> {
        match self.decode_message(bytes)? {
            Decoded::Command(e) => Ok(e),
            Decoded::Control(_) => Err(DecodeError::Shape("a control message, not a command".into())),
            Decoded::Move(_) => Err(DecodeError::Shape("a move's documents, not a command".into())),
        }
    }

    /// Decodes a message of the command topic: a command written with any
    /// known schema version, or a control message.
    pub fn decode_message(&self, bytes: &[u8]) -> Result<Decoded, DecodeError> {
        if bytes.first() == Some(&0) {
            return self.decode_registry_framed(bytes);
        }
        let (fp, datum) = single_object(bytes)?;
        if let Some(command) = self.model_command(&fp, datum) {
            return command;
        }
        let known = self.known.get(&fp).ok_or_else(|| DecodeError::UnknownFingerprint(hex(&fp)))?;
        decode_datum(&known.schema, known.family, datum)
    }

    /// Schema-registry framing: `0`, the schema id (4 bytes, big-endian),
    /// the binary datum. Commands only.
    fn decode_registry_framed(&self, bytes: &[u8]) -> Result<Decoded, DecodeError> {
        if bytes.len() < 5 {
            return Err(DecodeError::TooShort(bytes.len()));
        }
        let id = u32::from_be_bytes(bytes[1..5].try_into().expect("4 bytes"));
        let Some((registry, runtime)) = &self.registry else {
            let detail = "the message has schema-registry framing, but no --schema-registry is configured".to_string();
            return Err(DecodeError::UnknownSchemaId { id, detail });
        };
        let writer = registry.schema_blocking(runtime, id).map_err(|e| match e {
            e if e.is_retryable() => DecodeError::RegistryUnavailable(e.to_string()),
            e => DecodeError::UnknownSchemaId { id, detail: e.to_string() },
        })?;
        if let Some(command) = writer.fingerprint.and_then(|fp| self.model_command(&fp, &bytes[5..])) {
            return command;
        }
        if let Some(model) = model_schema_name(&writer.schema) {
            let reads = match &self.model {
                Some((codec, d)) => {
                    let versions: Vec<String> = std::iter::once(codec).chain(&self.earlier).map(|c| format!("version {} ({})", c.domain().version, c.fingerprint())).collect();
                    format!("this worker reads model {} {}", d.name, versions.join(", "))
                }
                None => "this worker runs without --model".to_string(),
            };
            let fingerprint = writer.fingerprint.map_or_else(|| "without a canonical form".to_string(), |fp| format!("schema fingerprint {}", hex(&fp)));
            return Err(DecodeError::UnknownSchemaId { id, detail: format!("the commands of model {model} ({fingerprint}), and {reads}") });
        }
        decode_datum(&writer.schema, Family::Command, &bytes[5..])
    }

    /// A datum written with the schema of fingerprint `fp`, when that is
    /// the model's or an earlier version's: decoded and bound to the model
    /// (a command of an earlier version is checked against this one as it
    /// is bound, as any command is).
    fn model_command(&self, fp: &[u8; 8], datum: &[u8]) -> Option<Result<Decoded, DecodeError>> {
        let (codec, domain) = self.model.as_ref()?;
        let codec = std::iter::once(codec).chain(&self.earlier).find(|c| c.writes(fp))?;
        Some(codec.decode_datum(datum).map(|m| Decoded::Command(crate::command::generic::bound::Bound::envelope(domain, m))))
    }

    /// Encodes an operator control message.
    pub fn encode_control(&self, c: &Control) -> Vec<u8> {
        let value = Value::Record(vec![
            ("action".into(), Value::String(c.action.as_str().into())),
            ("key".into(), Value::String(c.key.clone())),
            ("dlq_partition".into(), Value::Int(c.dlq_partition)),
            ("dlq_offset".into(), Value::Long(c.dlq_offset)),
            ("through".into(), Value::Long(c.through)),
            ("origin_offset".into(), Value::Long(c.origin_offset)),
            ("payload".into(), Value::Bytes(c.payload.clone())),
            ("requested_at".into(), Value::TimestampMillis(c.requested_at)),
            ("through_at".into(), Value::Long(c.through_at)),
        ]);
        encode_value(&self.control, self.control_fingerprint, value)
    }

    /// Whether `bytes` is a chunk of a cross-key move (by its framing and
    /// fingerprint, without decoding it).
    pub fn is_move(&self, bytes: &[u8]) -> bool {
        self.family_of(bytes) == Some(Family::Move)
    }

    /// Whether `bytes` is a message written by denorm itself, not by a
    /// producer: a move's chunk or an operator's control message (each
    /// carries messages that were accepted once).
    pub fn is_denorms_own(&self, bytes: &[u8]) -> bool {
        matches!(self.family_of(bytes), Some(Family::Move | Family::Control))
    }

    fn family_of(&self, bytes: &[u8]) -> Option<Family> {
        let fp = bytes.get(2..10).and_then(|f| <[u8; 8]>::try_from(f).ok())?;
        (bytes[..2] == MAGIC).then(|| self.known.get(&fp).map(|k| k.family)).flatten()
    }

    /// Encodes a chunk of a cross-key move.
    pub fn encode_move(&self, m: &MoveIn) -> Vec<u8> {
        let files = m
            .files
            .iter()
            .map(|f| Value::Record(vec![("id".into(), Value::String(f.id.clone())), ("path".into(), Value::String(f.path.clone())), ("contents".into(), Value::String(f.contents.clone()))]))
            .collect();
        let value = Value::Record(vec![
            ("move_id".into(), Value::String(m.move_id.clone())),
            ("source_partition".into(), Value::Int(m.source_partition)),
            ("source_offset".into(), Value::Long(m.source_offset)),
            ("from".into(), Value::String(m.from.clone())),
            ("to".into(), Value::String(m.to.clone())),
            ("chunk".into(), Value::Int(m.chunk)),
            ("last".into(), Value::Boolean(m.last)),
            ("issued_at".into(), Value::TimestampMillis(m.issued_at)),
            ("files".into(), Value::Array(files)),
            ("aborted".into(), Value::Boolean(m.aborted)),
        ]);
        encode_value(&self.moves, self.move_fingerprint, value)
    }
}

/// Bounds what the Avro decoder allocates at once: a corrupt length prefix
/// must not make it allocate gigabytes, and no command is larger than a
/// Kafka message (1 MiB by default).
fn limit_allocations() {
    apache_avro::util::max_allocation_bytes(MAX_ALLOCATION);
}

/// The writer schema's fingerprint and the datum of a message in
/// single-object encoding.
fn single_object(bytes: &[u8]) -> Result<([u8; 8], &[u8]), DecodeError> {
    if bytes.len() < 10 {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    if bytes[..2] != MAGIC {
        return Err(DecodeError::BadMarker(bytes[0], bytes[1]));
    }
    Ok((bytes[2..10].try_into().expect("8 bytes"), &bytes[10..]))
}

/// The model whose commands `schema` is, by its name
/// (`denorm.model.<model>.Command`, as `denorm schema --model` writes).
fn model_schema_name(schema: &Schema) -> Option<&str> {
    let Schema::Record(r) = schema else { return None };
    r.name.namespace.as_deref()?.strip_prefix("denorm.model.").filter(|_| r.name.name == "Command")
}

/// Reads all of `datum` as one binary datum written with `writer`.
fn read_datum(writer: &Schema, mut datum: &[u8]) -> Result<Value, DecodeError> {
    let value = apache_avro::from_avro_datum(writer, &mut datum, None).map_err(|e| DecodeError::Datum(e.to_string()))?;
    if !datum.is_empty() {
        return Err(DecodeError::TrailingBytes(datum.len()));
    }
    Ok(value)
}

/// Decodes one binary datum written with `writer` (all of `datum`).
fn decode_datum(writer: &Schema, family: Family, datum: &[u8]) -> Result<Decoded, DecodeError> {
    let value = read_datum(writer, datum)?;
    match family {
        Family::Control => control_from_value(value).map(Decoded::Control),
        Family::Move => move_from_value(value).map(Decoded::Move),
        Family::Command => from_value(writer, value).map(Decoded::Command),
    }
}

/// Encodes `value` under `schema` in single-object encoding. Public so tests
/// can write messages with older schema versions.
pub fn encode_value(schema: &Schema, fingerprint: [u8; 8], value: Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&fingerprint);
    out.extend(apache_avro::to_avro_datum(schema, value).expect("value matches its schema"));
    out
}

/// The fingerprint earlier denorm builds wrote: apache-avro's, of its
/// own (non-conforming) canonical form.
pub fn legacy_fingerprint(schema: &Schema) -> [u8; 8] {
    schema.fingerprint::<Rabin>().bytes.try_into().expect("Rabin fingerprints are 8 bytes")
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::moves::MovedFile;
    use crate::command::{Command, LogPosition};

    fn all_commands() -> Vec<Command> {
        let s = |x: &str| x.to_string();
        vec![
            Command::UpsertFile { id: s("f1"), path: s("/clinton/a.txt"), contents: s("hello"), previous_path: None },
            Command::UpsertFile { id: s("f2"), path: s("/bill/a.txt"), contents: s("moved"), previous_path: Some(s("/clinton/a.txt")) },
            Command::DeleteFile { id: s("f1"), path: s("/clinton/a.txt") },
            Command::RenamePath { from: s("/clinton/a"), to: s("/clinton/b") },
            Command::UpsertUser { id: s("1"), name: s("John Smith"), email: s("j@s.com"), dob: s("1970-10-24") },
            Command::UpsertPost { id: s("2"), user_id: s("1"), title: s("T"), body: s("B"), previous_user_id: None },
            Command::UpsertPost { id: s("3"), user_id: s("1"), title: s("T"), body: s("B"), previous_user_id: Some(s("4")) },
            Command::DeletePost { id: s("2"), user_id: s("1") },
            Command::DeleteUser { id: s("1") },
        ]
    }

    #[test]
    fn round_trips_every_command() {
        let codec = Codec::new();
        for c in all_commands() {
            let mut e = Envelope::new(c).of_tenant(Some("acme"));
            e.after = Some(LogPosition { partition: 5, offset: 1 << 40 });
            e.repair = Some(crate::command::Repair { unchanged_since: 1 << 33, seen: Some(false) });
            let bytes = codec.encode(&e);
            assert_eq!(&bytes[..2], &[0xC3, 0x01]);
            assert_eq!(codec.decode(&bytes).unwrap(), e);
        }
    }

    #[test]
    fn move_messages_round_trip_and_are_told_from_commands() {
        let codec = Codec::new();
        let m = MoveIn {
            move_id: "id-1".into(),
            source_partition: 3,
            source_offset: 77,
            from: "/clinton/a".into(),
            to: "/bill/a".into(),
            chunk: 1,
            last: true,
            issued_at: 1_700_000_000_000,
            files: vec![MovedFile { id: "f1".into(), path: "/bill/a/x.txt".into(), contents: "héllo".into() }],
            aborted: false,
        };
        let bytes = codec.encode_move(&m);
        assert_eq!(codec.decode_message(&bytes).unwrap(), Decoded::Move(m.clone()));
        assert!(codec.decode(&bytes).is_err(), "a move is not a command");
        let end = MoveIn { files: Vec::new(), aborted: true, ..m.clone() };
        assert_eq!(codec.decode_message(&codec.encode_move(&end)).unwrap(), Decoded::Move(end));
        // Written by a worker of schema version 1 (no `aborted`): read as
        // not aborted.
        let v1 = Schema::parse_str(MOVE_HISTORY[0]).unwrap();
        let Value::Record(mut fields) = apache_avro::from_avro_datum(&parse(MOVE_SCHEMA), &mut &bytes[10..], None).unwrap() else { panic!("a record") };
        fields.retain(|(name, _)| name != "aborted");
        let old = encode_value(&v1, canonical::fingerprint(MOVE_HISTORY[0]).unwrap(), Value::Record(fields));
        assert_ne!(old[2..10], bytes[2..10], "another fingerprint");
        assert!(codec.is_move(&old));
        assert_eq!(codec.decode_message(&old).unwrap(), Decoded::Move(m));
    }

    #[test]
    fn decodes_messages_written_with_older_schema_versions() {
        let codec = Codec::new();
        for (version, text) in HISTORY.iter().enumerate() {
            let old = Schema::parse_str(text).unwrap();
            let fp = canonical::fingerprint(text).unwrap();
            assert_ne!(fp, codec.current_fingerprint);
            // A user's delete is of version 7, the current one.
            for c in all_commands().into_iter().filter(|c| !matches!(c, Command::DeleteUser { .. })) {
                let mut e = Envelope::new(c).of_tenant(Some("acme"));
                e.after = Some(LogPosition { partition: 1, offset: 9 });
                e.repair = Some(crate::command::Repair { unchanged_since: 7, seen: Some(true) });
                // What each version could not say reads as its default.
                let mut want = e.clone();
                match version {
                    0..=3 => want.repair = None,
                    4 => want.repair = Some(crate::command::Repair { unchanged_since: 7, seen: None }),
                    _ => {}
                }
                if version < 3 {
                    want.after = None;
                }
                if version == 0 {
                    want = want.of_tenant(None);
                }
                match &mut want.command {
                    Command::UpsertPost { previous_user_id: p, .. } | Command::UpsertFile { previous_path: p, .. } if version < 2 => *p = None,
                    _ => {}
                }
                for fp in [fp, legacy_fingerprint(&old)] {
                    let decoded = codec.decode(&encode_value(&old, fp, to_value(&old, &e))).unwrap();
                    assert_eq!(decoded, want, "schema v{}", version + 1);
                }
            }
        }
    }

    /// The fingerprints every conforming implementation computes (fastavro's
    /// and Java's, checked against them by tests/it/interop.rs), and the legacy
    /// ones earlier builds wrote. A schema file change must update this
    /// table, docs/producers.md, and (for a new version) schemas/history.
    #[test]
    fn fingerprints_are_pinned() {
        let got: Vec<(&str, String, String)> = schema_fingerprints().into_iter().map(|f| (f.file, f.fingerprint, f.legacy)).collect();
        let want = [
            ("schemas/command.avsc", "8011b193097fef1b", "d8ce3f28ac3a6300"),
            ("schemas/history/command-v1.avsc", "7e1aaf9552f72321", "9f15df64f37ccd90"),
            ("schemas/history/command-v2.avsc", "9c7f9b599fb95260", "d5e0d0c37df914d2"),
            ("schemas/history/command-v3.avsc", "9848ea802671ddab", "56d74f3eaa44aceb"),
            ("schemas/history/command-v4.avsc", "845b46f200295293", "f646b8d14f1d49bd"),
            ("schemas/history/command-v5.avsc", "6adb1d29b2aec4c2", "e9e4af7624899fb4"),
            ("schemas/history/command-v6.avsc", "58b76e73ec3a27e2", "3dcbf00f80d817fa"),
            ("schemas/control.avsc", "01399534e774ed5d", "4c8686bfb32912d2"),
            ("schemas/history/control-v1.avsc", "2d6e0616c9179c82", "165f90003f878d05"),
            ("schemas/move.avsc", "27d583c379ec962f", "7d99d0db3a8ab38e"),
            ("schemas/history/move-v1.avsc", "c693f4031d5257e4", "e40370268cf05890"),
        ];
        let want: Vec<(&str, String, String)> = want.iter().map(|(f, a, b)| (*f, a.to_string(), b.to_string())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn legacy_fingerprints_decode_and_new_ones_are_written() {
        let codec = Codec::new();
        let e = Envelope::new(all_commands().remove(2));
        let bytes = codec.encode(&e);
        assert_eq!(hex(&bytes[2..10]), "8011b193097fef1b");
        let current = Schema::parse_str(CURRENT_SCHEMA).unwrap();
        let old = encode_value(&current, legacy_fingerprint(&current), to_value(&current, &e));
        assert_eq!(codec.decode(&old).unwrap(), e);
        let c = Control {
            action: crate::command::control::Action::Discard,
            key: "/a".into(),
            dlq_partition: 0,
            dlq_offset: -1,
            through: 4,
            origin_offset: -1,
            payload: Vec::new(),
            requested_at: 1,
            through_at: 9,
        };
        let mut old = codec.encode_control(&c);
        old[2..10].copy_from_slice(&legacy_fingerprint(&Schema::parse_str(CONTROL_SCHEMA).unwrap()));
        assert_eq!(codec.decode_message(&old).unwrap(), Decoded::Control(c));
    }

    #[test]
    fn rejects_garbage_with_clear_errors() {
        let codec = Codec::new();
        let good = codec.encode(&Envelope::new(all_commands().remove(0)));
        assert_eq!(codec.decode(&[1, 2]), Err(DecodeError::TooShort(2)));
        assert!(matches!(codec.decode(&[1u8; 20]), Err(DecodeError::BadMarker(1, 1))));
        // A leading 0 is schema-registry framing, unknown without a registry.
        assert!(matches!(codec.decode(&[0u8; 20]), Err(DecodeError::UnknownSchemaId { id: 0, .. })));
        assert_eq!(codec.decode(&[0u8; 4]), Err(DecodeError::TooShort(4)));
        let mut unknown = good.clone();
        unknown[2] ^= 0xFF;
        assert!(matches!(codec.decode(&unknown), Err(DecodeError::UnknownFingerprint(_))));
        for cut in 10..good.len() {
            assert!(codec.decode(&good[..cut]).is_err(), "truncated at {cut} decoded");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(codec.decode(&trailing), Err(DecodeError::TrailingBytes(1)));
    }

    #[test]
    fn never_panics_on_random_bytes() {
        let codec = Codec::new();
        let good = codec.encode(&Envelope::new(all_commands().remove(3)));
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..5000 {
            let mut b = good.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = 10 + (x as usize) % (b.len() - 10);
                b[i] = (x >> 32) as u8;
            }
            let _ = codec.decode(&b);
        }
    }
}
