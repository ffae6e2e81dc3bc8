//! The settings that change what a worker applies (review of verify, F1
//! and F20): the abort policy, the message size limit, the schema registry,
//! the partitioner rule and the attempts before an abort. The live workers
//! record them in the index they write (the record `worker-settings`, kept
//! like the log's identity); `denorm verify` and `denorm rebuild` replay
//! the log with them, so that the replay decides every message as the live
//! workers did. Workers whose settings differ from the record say so (a
//! warning and `denorm_worker_settings_mismatch`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::index::{Backend, IndexError};
use crate::worker::{OnAbort, WorkerConfig};

/// The name of the record, beside the index's other records.
pub const RECORD: &str = "worker-settings";

/// What a worker decides each message by, besides the message itself.
/// Every field is required, and a field this version does not know makes
/// the record unreadable: a replay that cannot know a setting refuses to
/// judge rather than guess.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplySettings {
    /// `--on-abort`: what happens to a key's later commands once one is
    /// aborted.
    pub on_abort: OnAbort,
    /// `--max-message-bytes`: larger commands are dead-lettered.
    pub max_message_bytes: usize,
    /// `--max-attempts`: attempts of a command the index refuses before it
    /// is aborted.
    pub max_attempts: u32,
    /// `--schema-registry`, without credentials: registry-framed messages
    /// are decoded (none: they are dead-lettered).
    pub schema_registry: Option<String>,
    /// `--any-partitioner`: messages in a partition other than their key's
    /// are applied.
    pub any_partitioner: bool,
}

/// Why recorded settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("the workers' settings recorded in the index: {0}")]
    Index(#[from] IndexError),
    #[error("the workers' settings recorded in the index cannot be read by this version ({0}): a newer worker recorded a setting this version does not know")]
    Unreadable(String),
    #[error("the workers decode registry-framed messages with {url}, and this process cannot ({why}): give it the registry's credentials (DENORM_SCHEMA_REGISTRY_USERNAME, _PASSWORD or _PASSWORD_FILE, _CA_CERT) as the workers have them")]
    Registry { url: String, why: String },
}

impl ApplySettings {
    /// The settings `cfg` applies with.
    pub fn of(cfg: &WorkerConfig) -> Self {
        ApplySettings {
            on_abort: cfg.on_abort,
            max_message_bytes: cfg.max_message_bytes,
            max_attempts: cfg.max_attempts,
            schema_registry: cfg.registry.as_ref().map(|r| without_credentials(r.url())),
            any_partitioner: cfg.any_partitioner,
        }
    }

    /// Each setting in which `self` differs from `other`, as
    /// `name: this vs other`.
    pub fn differences(&self, other: &ApplySettings) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}: {a} vs {b}"));
            }
        };
        cmp("on_abort", self.on_abort.name().to_string(), other.on_abort.name().to_string());
        cmp("max_message_bytes", self.max_message_bytes.to_string(), other.max_message_bytes.to_string());
        cmp("max_attempts", self.max_attempts.to_string(), other.max_attempts.to_string());
        let registry = |r: &Option<String>| r.clone().unwrap_or_else(|| "none".into());
        cmp("schema_registry", registry(&self.schema_registry), registry(&other.schema_registry));
        cmp("any_partitioner", self.any_partitioner.to_string(), other.any_partitioner.to_string());
        out
    }

    /// Sets them on a replay's `cfg`; the registry's client is made from
    /// the recorded URL with this process's credentials (never recorded).
    pub fn apply_to(&self, cfg: &mut WorkerConfig) -> Result<(), SettingsError> {
        cfg.on_abort = self.on_abort;
        cfg.max_message_bytes = self.max_message_bytes;
        cfg.max_attempts = self.max_attempts;
        cfg.any_partitioner = self.any_partitioner;
        cfg.registry = match &self.schema_registry {
            None => None,
            Some(url) => {
                let registry = |why: String| SettingsError::Registry { url: url.clone(), why };
                let c = crate::codec::registry::RegistryConfig::from_env(url).map_err(|e| registry(e.to_string()))?;
                Some(Arc::new(crate::codec::registry::Registry::new(c).map_err(|e| registry(e.to_string()))?))
            }
        };
        Ok(())
    }

    /// The record's JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialize")
    }

    /// From the record's JSON.
    pub fn from_json(v: serde_json::Value) -> Result<Self, SettingsError> {
        serde_json::from_value(v).map_err(|e| SettingsError::Unreadable(e.to_string()))
    }
}

/// The settings recorded in the index (`None`: no worker of this version
/// has started on it).
pub fn recorded(record: Option<serde_json::Value>) -> Result<Option<ApplySettings>, SettingsError> {
    record.map(ApplySettings::from_json).transpose()
}

/// At a live worker's start: records `mine`, the last worker started
/// winning (a change of settings is recorded once a worker started with
/// the new ones). Returns how the record differed before, for the caller
/// to warn about: workers of one index are to apply alike.
pub fn record(backend: &dyn Backend, mine: &ApplySettings) -> Result<Vec<String>, SettingsError> {
    let before = match recorded(backend.record(RECORD)?) {
        Ok(r) => r,
        // Recorded by a newer version: this one's replaces it.
        Err(SettingsError::Unreadable(why)) => {
            tracing::warn!(%why, "the workers' settings recorded in the index are of a newer version: recording this worker's");
            None
        }
        Err(e) => return Err(e),
    };
    if before.as_ref() != Some(mine) {
        backend.save_record(RECORD, &mine.to_json())?;
    }
    Ok(before.map(|b| mine.differences(&b)).unwrap_or_default())
}

/// [`record`] at a live worker's start, with `cfg`'s settings: a warning
/// names how the record differed.
pub fn announce(backend: &dyn Backend, cfg: &WorkerConfig) -> Result<(), IndexError> {
    let differences = match record(backend, &ApplySettings::of(cfg)) {
        Ok(d) => d,
        Err(SettingsError::Index(e)) => return Err(e),
        Err(e) => return Err(IndexError::Backend(e.to_string())),
    };
    if !differences.is_empty() {
        tracing::warn!(differences = %differences.join(", "), "this worker's settings (first) differ from those the index recorded (second): recorded this worker's; workers still running with the others apply messages differently (denorm_worker_settings_mismatch)");
    }
    Ok(())
}

/// Compares this worker's settings with the record, every little while:
/// `denorm_worker_settings_mismatch` says whether they differ, and a
/// warning names the differences whenever they change.
pub fn check(backend: &dyn Backend, mine: &ApplySettings, last: &mut Vec<String>) {
    let differences = match backend.record(RECORD).map_err(SettingsError::from).and_then(recorded) {
        Ok(Some(r)) => mine.differences(&r),
        Ok(None) => Vec::new(),
        Err(error) => {
            tracing::debug!(%error, "reading the workers' settings recorded in the index");
            return;
        }
    };
    metrics::gauge!(crate::metrics::WORKER_SETTINGS_MISMATCH).set(if differences.is_empty() { 0.0 } else { 1.0 });
    if differences != *last && !differences.is_empty() {
        tracing::warn!(differences = %differences.join(", "), "this worker's settings (first) differ from those another worker of this index recorded (second): the workers apply messages differently, and verify and rebuild replay with the recorded ones");
    }
    *last = differences;
}

/// A URL as recorded and logged: without the user and password it may
/// carry.
fn without_credentials(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::KafkaConfig;

    fn cfg() -> WorkerConfig {
        WorkerConfig::new(KafkaConfig::new("127.0.0.1:9", "t"), "g")
    }

    #[test]
    fn the_record_round_trips_and_names_each_difference() {
        let mut c = cfg();
        let defaults = ApplySettings::of(&c);
        c.on_abort = OnAbort::Skip;
        c.max_message_bytes = 4 << 20;
        let skip = ApplySettings::of(&c);
        assert_eq!(ApplySettings::from_json(skip.to_json()).unwrap(), skip);
        assert_eq!(skip.differences(&defaults), vec!["on_abort: skip vs park".to_string(), format!("max_message_bytes: {} vs {}", 4 << 20, 1 << 20)]);
        assert!(defaults.differences(&defaults).is_empty());
        let mut replay = cfg();
        skip.apply_to(&mut replay).unwrap();
        assert_eq!(ApplySettings::of(&replay), skip);
    }

    #[test]
    fn a_record_with_a_setting_this_version_does_not_know_or_lacks_one_is_unreadable() {
        let mut v = ApplySettings::of(&cfg()).to_json();
        v["partition_by_tenant"] = serde_json::json!(true);
        assert!(matches!(ApplySettings::from_json(v.clone()), Err(SettingsError::Unreadable(_))));
        let mut v = ApplySettings::of(&cfg()).to_json();
        v.as_object_mut().unwrap().remove("max_attempts");
        assert!(matches!(ApplySettings::from_json(v), Err(SettingsError::Unreadable(_))));
    }

    #[test]
    fn a_registry_is_recorded_without_its_credentials() {
        let url = reqwest::Url::parse("https://svc:s3cret@registry.example:8081/").unwrap();
        assert_eq!(without_credentials(&url), "https://registry.example:8081/");
    }
}
