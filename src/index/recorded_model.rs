//! The model a generation of an index records, on either backend: what a
//! writer or a reader decides when it finds one, so that an index is never
//! written or read with another model than the one its documents follow
//! (docs/model.md, "Running a model"). No I/O: each backend reads and
//! writes the record its own way.

use serde_json::{json, Value};

use super::IndexError;
use crate::domain::Domain;

/// What a generation records of `model`: its name, version and
/// fingerprint, the last deciding.
pub fn record_of(model: &Domain) -> Value {
    json!({"name": model.name, "version": model.version, "fingerprint": model.fingerprint()})
}

fn shown(v: &Value) -> String {
    format!("model {} version {} (fingerprint {})", v["name"].as_str().unwrap_or("?"), v["version"], v["fingerprint"].as_str().unwrap_or("?"))
}

/// What to do about a generation's recorded model.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// The generation holds this model (or none, and none is wanted).
    Agrees,
    /// It records none and has nothing written yet: record this one.
    Record(Value),
}

/// Decides, for generation `generation` of the index `at`, what a handle of
/// `ours` does with what the generation records (`held`). `written`: the
/// generation holds something already (it was written without a model);
/// `record`: the handle writes (a reader records nothing). Refused: another
/// model, a model where none was written, none where one was.
pub fn decide(at: &str, generation: u64, held: Option<&Value>, ours: Option<&Domain>, written: bool, record: bool) -> Result<Decision, IndexError> {
    let refuse = |held: String, wanted: String| {
        Err(IndexError::LogMismatch(format!(
            "generation {generation} of the index at {at} holds {held}, not {wanted}: a model is changed by a rebuild into a new generation, which `denorm rebuild` does not do for a model yet (docs/model.md, \"Status\")"
        )))
    };
    let ours = ours.map(record_of);
    match (held, ours) {
        (None, None) => Ok(Decision::Agrees),
        (Some(held), None) => refuse(shown(held), "the compiled-in kinds alone (pass its --model)".into()),
        (Some(held), Some(ours)) if held["fingerprint"] == ours["fingerprint"] => Ok(Decision::Agrees),
        (Some(held), Some(ours)) => refuse(shown(held), shown(&ours)),
        (None, Some(ours)) if written => refuse("the compiled-in kinds alone".into(), shown(&ours)),
        (None, Some(ours)) if record => Ok(Decision::Record(ours)),
        (None, Some(ours)) => refuse("nothing written yet".into(), shown(&ours)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shop() -> Domain {
        Domain::parse("shop.toml", include_str!("../../models/shop.toml")).unwrap()
    }

    #[test]
    fn a_generation_is_read_and_written_with_the_model_it_records_only() {
        let d = shop();
        let held = record_of(&d);
        let decide = |held: Option<&Value>, ours: Option<&Domain>, written: bool, record: bool| decide("/i", 0, held, ours, written, record);
        assert_eq!(decide(None, None, true, true).unwrap(), Decision::Agrees);
        assert_eq!(decide(Some(&held), Some(&d), true, false).unwrap(), Decision::Agrees);
        assert_eq!(decide(None, Some(&d), false, true).unwrap(), Decision::Record(held.clone()));
        let refused = |r: Result<Decision, IndexError>| match r {
            Err(IndexError::LogMismatch(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        assert!(refused(decide(Some(&held), None, true, true)).contains("holds model shop version 1"));
        assert!(refused(decide(None, Some(&d), true, true)).contains("holds the compiled-in kinds alone, not model shop"));
        assert!(refused(decide(None, Some(&d), false, false)).contains("holds nothing written yet"));
        let mut other = held.clone();
        other["fingerprint"] = json!("0");
        assert!(refused(decide(Some(&other), Some(&d), true, true)).contains("fingerprint 0"));
    }
}
