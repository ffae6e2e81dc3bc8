//! A model's earlier versions (`earlier = ["shop-v1.toml"]`): the versions
//! whose commands the topic may still hold. They are loaded beside the
//! model, and each must write only what reads as a command of this
//! version: the same model, a lower version, each of its kinds still
//! declared and ordered by the same key, each of its fields of the same
//! type here, and each field this version requires required there too.

use std::path::Path;

use super::{limits, Domain, Field, FieldType, ModelError};

/// A file named by `earlier`, as written, and where.
#[derive(Debug, Clone)]
pub(crate) struct Declared {
    pub path: String,
    pub line: usize,
    pub column: usize,
}

/// How many files deep earlier versions may name earlier ones.
const DEPTH: usize = 8;

/// Reads and checks the model file at `path` and the earlier versions it
/// names, relative to its directory (and theirs, `depth` files deep).
pub(super) fn load(path: &Path, depth: usize) -> Result<Domain, ModelError> {
    let shown = path.display().to_string();
    let unreadable = |e: std::io::Error| ModelError { file: shown.clone(), line: 0, column: 0, field: String::new(), message: format!("cannot read the model file: {e}") };
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    let mut d = Domain::parse(&shown, &text)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut earlier: Vec<Domain> = Vec::new();
    for decl in d.earlier_files.clone() {
        let at = |message: String| ModelError { file: shown.clone(), line: decl.line, column: decl.column, field: "earlier".into(), message };
        if depth >= DEPTH {
            return Err(at(format!("earlier versions name earlier ones more than {DEPTH} files deep")));
        }
        let mut e = load(&base.join(&decl.path), depth + 1).map_err(|e| at(e.to_string()))?;
        let theirs = std::mem::take(&mut e.earlier);
        for version in std::iter::once(e).chain(theirs) {
            compatible(&d, &version).map_err(|why| at(format!("{why} ({})", decl.path)))?;
            if !earlier.iter().any(|x| x.fingerprint() == version.fingerprint()) {
                earlier.push(version);
            }
        }
    }
    if earlier.len() > limits::EARLIER {
        return Err(ModelError { file: shown, line: 0, column: 0, field: "earlier".into(), message: format!("{} earlier versions; a model reads at most {}", earlier.len(), limits::EARLIER) });
    }
    d.earlier = earlier;
    Ok(d)
}

/// Why the commands of `then` would not all read as commands of `now`.
fn compatible(now: &Domain, then: &Domain) -> Result<(), String> {
    let v = then.version;
    if then.name != now.name {
        return Err(format!("an earlier version is of model {}, not {}", then.name, now.name));
    }
    if v >= now.version {
        return Err(format!("an earlier version is version {v}, not below this one's {}", now.version));
    }
    for k in &then.kinds {
        let Some(here) = now.kind(&k.name) else {
            return Err(format!("version {v} declares kind {}, which this version does not: the topic's commands of it could not be read", k.name));
        };
        if here.key != k.key {
            return Err(format!("kind {} is ordered by another key in version {v}: its documents would change keys without owner changes", k.name));
        }
        fields(v, &format!("kinds.{}.fields", k.name), &here.fields, &k.fields)?;
        for n in &k.nested {
            let Some(list) = here.nested_list(&n.name) else {
                return Err(format!("version {v} declares kinds.{}.nested.{}, which this version does not", k.name, n.name));
            };
            fields(v, &format!("kinds.{}.nested.{}", k.name, n.name), &list.fields, &n.fields)?;
        }
    }
    Ok(())
}

/// Fields `then` (of version `v`) has keep their type in `now`, and the
/// fields `now` requires are required in `then`.
fn fields(v: u32, at: &str, now: &[Field], then: &[Field]) -> Result<(), String> {
    for f in then {
        match now.iter().find(|n| n.name == f.name) {
            None => return Err(format!("version {v} declares {at}.{}, which this version does not: upserts of version {v} carrying it would be refused", f.name)),
            Some(n) if !same_type(&n.ty, &f.ty) => return Err(format!("{at}.{} is of type {} in version {v} and {} here", f.name, f.ty.name(), n.ty.name())),
            Some(_) => {}
        }
    }
    for n in now.iter().filter(|n| !n.optional) {
        if then.iter().find(|f| f.name == n.name).is_none_or(|f| f.optional) {
            return Err(format!("{at}.{} is required here, but upserts of version {v} may lack it: declare it optional", n.name));
        }
    }
    Ok(())
}

/// Types whose values read alike: a text field's analyzer and exactness
/// decide how it is indexed, not what a command holds.
fn same_type(a: &FieldType, b: &FieldType) -> bool {
    match (a, b) {
        (FieldType::Text { .. }, FieldType::Text { .. }) => true,
        _ => a == b,
    }
}
