//! The model a generation of an index records, on either backend: what a
//! writer or a reader decides when it finds one, so that an index is never
//! written or read with another model than the one its documents follow
//! (docs/model.md, "Running a model"). No I/O: each backend reads and
//! writes the record its own way.

use serde_json::{json, Value};

use super::IndexError;
use crate::domain::Domain;

/// What a generation records of `model`: its name, version and
/// fingerprint, the last deciding, and the text of its file, which
/// [`domain_of`] reads back.
pub fn record_of(model: &Domain) -> Value {
    let earlier: Vec<Value> = model.earlier.iter().map(|e| json!({"version": e.version, "fingerprint": e.fingerprint()})).collect();
    json!({"name": model.name, "version": model.version, "fingerprint": model.fingerprint(), "text": model.source, "earlier": earlier})
}

/// The versions whose commands a log written for the generation
/// recording `held` may hold, which `model` must read (itself or its
/// `earlier`): the versions named, or `None` when it reads them all.
pub fn unread_versions(held: &Value, model: &Domain) -> Option<String> {
    let reads: Vec<String> = std::iter::once(model).chain(&model.earlier).map(Domain::fingerprint).collect();
    let versions = std::iter::once(held).chain(held["earlier"].as_array().into_iter().flatten());
    let unread: Vec<String> = versions
        .filter(|v| !reads.iter().any(|f| Some(f.as_str()) == v["fingerprint"].as_str()))
        .map(|v| format!("version {} (fingerprint {})", v["version"], v["fingerprint"].as_str().unwrap_or("?")))
        .collect();
    (!unread.is_empty()).then(|| unread.join(", "))
}

/// The model a generation's record (`held`) names, read from the text it
/// keeps: what a process that was not given it needs to name the
/// generation's kinds (a rebuild's cutover from a generation of another
/// model, the deletion of an old generation). Its fingerprint must be the
/// recorded one.
pub fn domain_of(generation: u64, held: &Value) -> Result<&'static Domain, IndexError> {
    let corrupt = |why: String| IndexError::Corrupt(format!("the model generation {generation} records ({}): {why}", shown(held)));
    let text = held["text"].as_str().ok_or_else(|| corrupt("the record keeps no text of the model (written by an earlier version of denorm)".into()))?;
    let d = Domain::parse(&format!("the record of generation {generation}"), text).map_err(|e| corrupt(e.to_string()))?;
    if d.fingerprint() != held["fingerprint"].as_str().unwrap_or_default() {
        return Err(corrupt(format!("its text has the fingerprint {}", d.fingerprint())));
    }
    Ok(d.interned())
}

/// Whether the generation recording `held` holds `ours` (both `None`: the
/// compiled-in kinds alone).
pub fn holds(held: Option<&Value>, ours: Option<&Domain>) -> bool {
    match (held, ours) {
        (None, None) => true,
        (Some(h), Some(d)) => h["fingerprint"].as_str() == Some(d.fingerprint().as_str()),
        _ => false,
    }
}

/// How a record is named to an operator: `model shop version 1`, or the
/// compiled-in kinds.
pub fn named(held: Option<&Value>) -> String {
    held.map_or_else(|| "the compiled-in kinds alone".to_string(), shown)
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
            "generation {generation} of the index at {at} holds {held}, not {wanted}: a model is changed by a rebuild into a new generation (`denorm rebuild --model M --change-model`), whose workers then run with the new --model (docs/model.md, \"Changing a model\")"
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
        crate::domain::tests::shop()
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

    #[test]
    fn a_generations_model_is_read_back_from_its_record_and_must_match_its_fingerprint() {
        let d = shop();
        let held = record_of(&d);
        assert_eq!(domain_of(3, &held).unwrap().fingerprint(), d.fingerprint());
        assert!(holds(Some(&held), Some(&d)) && holds(None, None) && !holds(Some(&held), None) && !holds(None, Some(&d)));
        let mut forged = held.clone();
        forged["text"] = json!(d.source.replace("version = 1", "version = 2"));
        let why = domain_of(3, &forged).unwrap_err().to_string();
        assert!(why.contains("generation 3") && why.contains("has the fingerprint"), "{why}");
        let mut old = held.clone();
        old.as_object_mut().unwrap().remove("text");
        assert!(domain_of(3, &old).unwrap_err().to_string().contains("no text"));
        assert_eq!(named(None), "the compiled-in kinds alone");
        assert!(named(Some(&held)).starts_with("model shop version 1"));
    }
}
