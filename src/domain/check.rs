//! A model file's text made a [`Domain`], or refused with the place and the
//! field: names, types, references, ordering keys, copies and limits.

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;

use super::file::{CopyFile, FieldFile, FieldsFile, File, KeyFile, KindFile};
use super::{limits, Analyzer, Domain, Field, FieldType, Kind, ModelError, Nested, OrderingKey, OwnerCopy, RESERVED};

/// The file's text and name, for turning a span into a line and a column.
struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn error(&self, span: Range<usize>, field: &str, message: impl Into<String>) -> ModelError {
        let (line, column) = position(self.text, span.start);
        ModelError { file: self.file.to_owned(), line, column, field: field.to_owned(), message: message.into() }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn position(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

pub(super) fn parse(file: &str, text: &str) -> Result<Domain, ModelError> {
    let src = Source { file, text };
    let raw: File = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        let (line, column) = if e.span().is_some() { position(text, span.start) } else { (0, 0) };
        ModelError { file: file.to_owned(), line, column, field: String::new(), message: e.message().trim_end().to_owned() }
    })?;
    name(&src, &raw.name, "name")?;
    if *raw.version.get_ref() == 0 {
        return Err(src.error(raw.version.span(), "version", "the model's version starts at 1"));
    }
    if raw.kinds.is_empty() {
        return Err(src.error(0..0, "kinds", "a model declares at least one kind ([kinds.<name>])"));
    }
    if raw.kinds.len() > limits::KINDS {
        return Err(src.error(0..0, "kinds", format!("{} kinds; a model has at most {}", raw.kinds.len(), limits::KINDS)));
    }
    // Field types first, for every kind: keys and copies look across kinds.
    let mut typed = BTreeMap::new();
    for (k, kind) in &raw.kinds {
        let at = format!("kinds.{}", k.get_ref());
        name(&src, k, &at)?;
        typed.insert(k.get_ref().clone(), fields(&src, &raw, &kind.get_ref().fields, k.span(), &format!("{at}.fields"), false)?);
    }
    let mut kinds = Vec::new();
    for (k, kind) in &raw.kinds {
        let at = format!("kinds.{}", k.get_ref());
        let fields = typed[k.get_ref()].clone();
        let key = key(&src, &kind.get_ref().key, &fields, &at)?;
        let mut kind_out = Kind { name: k.get_ref().clone(), key, fields, copies: Vec::new(), nested: Vec::new() };
        kind_out.nested = nested(&src, &raw, kind.get_ref(), &kind_out, k.span(), &at)?;
        kind_out.copies = copies(&src, kind.get_ref(), &kind_out, &typed, k.span(), &at)?;
        kinds.push(kind_out);
    }
    for kind in &kinds {
        owner_keyed_by_id(&src, &raw, kind, &kinds)?;
    }
    if raw.earlier.len() > limits::EARLIER {
        return Err(src.error(0..0, "earlier", format!("{} earlier versions; a model reads at most {}", raw.earlier.len(), limits::EARLIER)));
    }
    let earlier_files = raw
        .earlier
        .iter()
        .map(|f| {
            let (line, column) = position(text, f.span().start);
            super::earlier::Declared { path: f.get_ref().clone(), line, column }
        })
        .collect();
    Ok(Domain { name: raw.name.into_inner(), version: raw.version.into_inner(), kinds, source: text.to_string(), earlier: Vec::new(), earlier_files })
}

/// A name of the model, a kind, a field, a copy or a list: lowercase ASCII
/// letters, digits and `_`, starting with a letter.
fn name(src: &Source, n: &Spanned<String>, at: &str) -> Result<(), ModelError> {
    let s = n.get_ref();
    let ok = s.len() <= limits::NAME && s.starts_with(|c: char| c.is_ascii_lowercase()) && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(src.error(n.span(), at, format!("`{s}` is not a name: lowercase letters, digits and `_`, starting with a letter, at most {} characters", limits::NAME)))
    }
}

fn fields(src: &Source, raw: &File, decl: &FieldsFile, place: Range<usize>, at: &str, nested: bool) -> Result<Vec<Field>, ModelError> {
    if decl.len() > limits::FIELDS {
        return Err(src.error(place, at, format!("{} fields; at most {}", decl.len(), limits::FIELDS)));
    }
    let mut out = Vec::new();
    for (n, f) in decl {
        let here = format!("{at}.{}", n.get_ref());
        name(src, n, &here)?;
        if RESERVED.contains(&n.get_ref().as_str()) {
            return Err(src.error(n.span(), &here, format!("`{}` is every document's own (reserved: {})", n.get_ref(), RESERVED.join(", "))));
        }
        let field = field(src, raw, f, &here)?;
        if nested && !field.ty.is_scalar() {
            return Err(src.error(f.span(), &here, format!("a nested object's field cannot be a {}", if matches!(field.ty, FieldType::Path) { "path" } else { "ref" })));
        }
        if matches!(field.ty, FieldType::Path) && out.iter().any(|f: &Field| matches!(f.ty, FieldType::Path)) {
            return Err(src.error(n.span(), &here, "a kind has at most one path field (a rename names a prefix, not a field)"));
        }
        out.push(field);
    }
    Ok(out)
}

fn field(src: &Source, raw: &File, f: &Spanned<FieldFile>, at: &str) -> Result<Field, ModelError> {
    let decl = f.get_ref();
    // A bare type (`total = "float"`) has no span of its own: the field's.
    let place = |s: &Spanned<String>| if s.span().is_empty() { f.span() } else { s.span() };
    // `{ ref = "customer" }` alone is a keyword.
    let implied;
    let ty = match (&decl.ty, &decl.reference) {
        (Some(ty), _) => ty,
        (None, Some(_)) => {
            implied = Spanned::new(0..0, "keyword".to_owned());
            &implied
        }
        (None, None) => return Err(src.error(f.span(), at, format!("a field needs a type: {}", FieldType::NAMES))),
    };
    let only = |what: &str, v: Option<Range<usize>>| -> Result<(), ModelError> {
        match v {
            Some(span) => Err(src.error(span, at, format!("`{what}` is for {} fields only", if what == "ref" { "keyword" } else { "text" }))),
            None => Ok(()),
        }
    };
    let t = match ty.get_ref().as_str() {
        "text" => {
            let analyzer = match &decl.analyzer {
                None => Analyzer::Standard,
                Some(a) => match Analyzer::ALL.into_iter().find(|n| n.name() == a.get_ref()) {
                    Some(a) => a,
                    None => return Err(src.error(a.span(), at, format!("unknown analyzer `{}`: {}", a.get_ref(), Analyzer::ALL.map(Analyzer::name).join(", ")))),
                },
            };
            only("ref", decl.reference.as_ref().map(|r| r.span()))?;
            FieldType::Text { analyzer, exact: flag(&decl.exact) }
        }
        other => {
            only("analyzer", decl.analyzer.as_ref().map(|a| a.span()))?;
            only("exact", decl.exact.as_ref().map(|e| e.span()))?;
            let t = match other {
                "keyword" => FieldType::Keyword,
                "integer" => FieldType::Integer,
                "float" => FieldType::Float,
                "boolean" => FieldType::Boolean,
                "date" => FieldType::Date,
                "keywords" => FieldType::Keywords,
                "path" => FieldType::Path,
                _ => return Err(src.error(place(ty), at, format!("unknown type `{other}`: {}", FieldType::NAMES))),
            };
            match (&decl.reference, t) {
                (Some(r), FieldType::Keyword) => reference(src, raw, r, at)?,
                (Some(r), _) => return Err(src.error(r.span(), at, "`ref` is for keyword fields only")),
                (None, t) => t,
            }
        }
    };
    Ok(Field { name: last(at), ty: t, optional: flag(&decl.optional) })
}

fn reference(src: &Source, raw: &File, r: &Spanned<String>, at: &str) -> Result<FieldType, ModelError> {
    if raw.kinds.keys().any(|k| k.get_ref() == r.get_ref()) {
        Ok(FieldType::Ref { kind: r.get_ref().clone() })
    } else {
        Err(src.error(r.span(), at, format!("`ref = \"{}\"` names no kind of this model ({})", r.get_ref(), kind_names(raw))))
    }
}

fn kind_names(raw: &File) -> String {
    raw.kinds.keys().map(|k| k.get_ref().as_str()).collect::<Vec<_>>().join(", ")
}

fn flag(v: &Option<Spanned<bool>>) -> bool {
    v.as_ref().is_some_and(|v| *v.get_ref())
}

fn last(at: &str) -> String {
    at.rsplit('.').next().unwrap_or(at).to_owned()
}

fn key(src: &Source, k: &Spanned<KeyFile>, fields: &[Field], at: &str) -> Result<OrderingKey, ModelError> {
    let here = format!("{at}.key");
    let find = |n: &Spanned<String>| -> Result<&Field, ModelError> {
        let f = fields.iter().find(|f| &f.name == n.get_ref()).ok_or_else(|| src.error(n.span(), &here, format!("`{}` is not a field of this kind", n.get_ref())))?;
        if f.optional {
            return Err(src.error(n.span(), &here, format!("`{}` orders the kind's commands, so it cannot be optional", f.name)));
        }
        Ok(f)
    };
    match k.get_ref() {
        KeyFile::Named(s) if s == "id" => Ok(OrderingKey::Id),
        KeyFile::Named(s) => Err(src.error(k.span(), &here, format!("`{s}`: a key is \"id\", {{ owner = \"<a ref field>\" }} or {{ path = \"<a path field>\" }}"))),
        KeyFile::Table { owner: Some(o), path: None } => match &find(o)?.ty {
            FieldType::Ref { kind } => Ok(OrderingKey::Owner { field: o.get_ref().clone(), owner: kind.clone() }),
            other => Err(src.error(o.span(), &here, format!("`{}` is a {} field; an owner key names a ref field ({{ type = \"keyword\", ref = \"<kind>\" }})", o.get_ref(), other.name()))),
        },
        KeyFile::Table { owner: None, path: Some(p) } => match &find(p)?.ty {
            FieldType::Path => Ok(OrderingKey::PathTop { field: p.get_ref().clone() }),
            other => Err(src.error(p.span(), &here, format!("`{}` is a {} field; a path key names a path field", p.get_ref(), other.name()))),
        },
        KeyFile::Table { .. } => Err(src.error(k.span(), &here, "a key names either `owner` or `path`, not both or neither")),
    }
}

fn nested(src: &Source, raw: &File, decl: &KindFile, kind: &Kind, place: Range<usize>, at: &str) -> Result<Vec<Nested>, ModelError> {
    if decl.nested.len() > limits::NESTED {
        return Err(src.error(place, &format!("{at}.nested"), format!("{} nested lists; at most {}", decl.nested.len(), limits::NESTED)));
    }
    let mut out = Vec::new();
    for (n, list) in &decl.nested {
        let here = format!("{at}.nested.{}", n.get_ref());
        name(src, n, &here)?;
        if kind.field(n.get_ref()).is_some() {
            return Err(src.error(n.span(), &here, format!("`{}` is a field of the kind already", n.get_ref())));
        }
        let fields = fields(src, raw, list.get_ref(), n.span(), &here, true)?;
        if fields.is_empty() {
            return Err(src.error(list.span(), &here, "a nested list's objects have at least one field"));
        }
        out.push(Nested { name: n.get_ref().clone(), fields });
    }
    Ok(out)
}

fn copies(src: &Source, decl: &KindFile, kind: &Kind, typed: &BTreeMap<String, Vec<Field>>, place: Range<usize>, at: &str) -> Result<Vec<OwnerCopy>, ModelError> {
    if decl.copies.len() > limits::COPIES {
        return Err(src.error(place, &format!("{at}.copies"), format!("{} copies; at most {}", decl.copies.len(), limits::COPIES)));
    }
    let mut out = Vec::new();
    for (n, c) in &decl.copies {
        let here = format!("{at}.copies.{}", n.get_ref());
        name(src, n, &here)?;
        if kind.field(n.get_ref()).is_some() || kind.nested.iter().any(|l| &l.name == n.get_ref()) {
            return Err(src.error(n.span(), &here, format!("`{}` names a field or a nested list of the kind already", n.get_ref())));
        }
        out.push(copy(src, c, kind, typed, &here)?);
    }
    Ok(out)
}

fn copy(src: &Source, c: &Spanned<CopyFile>, kind: &Kind, typed: &BTreeMap<String, Vec<Field>>, at: &str) -> Result<OwnerCopy, ModelError> {
    let CopyFile { via, fields } = c.get_ref();
    let owner = match kind.field(via.get_ref()).map(|f| &f.ty) {
        Some(FieldType::Ref { kind }) => kind.clone(),
        Some(other) => return Err(src.error(via.span(), at, format!("`via = \"{}\"` is a {} field; a copy is made through a ref field", via.get_ref(), other.name()))),
        None => return Err(src.error(via.span(), at, format!("`via = \"{}\"` is not a field of this kind", via.get_ref()))),
    };
    // Copies across ordering keys (the owner's commands in another
    // partition than the dependents') are refused until a change of the
    // owner can reach its dependents through the log.
    if kind.key != (OrderingKey::Owner { field: via.get_ref().clone(), owner: owner.clone() }) {
        return Err(src.error(
            via.span(),
            at,
            format!(
                "copies across ordering keys are not supported yet: the kind is keyed by {}, not by its owner `{}`; declare `key = {{ owner = \"{}\" }}`",
                shown(&kind.key),
                via.get_ref(),
                via.get_ref()
            ),
        ));
    }
    if fields.get_ref().is_empty() || fields.get_ref().len() > limits::COPIED_FIELDS {
        return Err(src.error(fields.span(), at, format!("a copy carries 1 to {} fields", limits::COPIED_FIELDS)));
    }
    let mut names = Vec::new();
    for f in fields.get_ref() {
        match typed[&owner].iter().find(|o| &o.name == f.get_ref()) {
            None => return Err(src.error(f.span(), at, format!("`{}` is not a field of `{owner}` ({})", f.get_ref(), typed[&owner].iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")))),
            Some(o) if !o.ty.is_scalar() => {
                return Err(src.error(
                    f.span(),
                    at,
                    format!("`{owner}.{}` is a {} field; a copy carries values, not paths or refs", o.name, if matches!(o.ty, FieldType::Path) { "path" } else { "ref" }),
                ))
            }
            Some(_) if names.contains(f.get_ref()) => return Err(src.error(f.span(), at, format!("`{}` is copied twice", f.get_ref()))),
            Some(_) => names.push(f.get_ref().clone()),
        }
    }
    Ok(OwnerCopy { name: last(at), via: via.get_ref().clone(), owner, fields: names })
}

/// An owner key names a kind keyed by its own id, so that the owner and its
/// dependents share the key (one partition, one order).
fn owner_keyed_by_id(src: &Source, raw: &File, kind: &Kind, kinds: &[Kind]) -> Result<(), ModelError> {
    let OrderingKey::Owner { field, owner } = &kind.key else { return Ok(()) };
    let owner_kind = kinds.iter().find(|k| &k.name == owner).expect("refs resolved");
    if owner == &kind.name || owner_kind.key != OrderingKey::Id {
        let decl = raw.kinds.iter().find(|(k, _)| k.get_ref() == &kind.name).map(|(_, d)| d).expect("declared");
        return Err(src.error(
            decl.get_ref().key.span(),
            &format!("kinds.{}.key", kind.name),
            format!("`{field}` names `{owner}`, which is keyed by {}; an owner must be keyed by its own id (key = \"id\")", shown(&owner_kind.key)),
        ));
    }
    Ok(())
}

fn shown(k: &OrderingKey) -> String {
    match k {
        OrderingKey::Id => "its own id".into(),
        OrderingKey::Owner { field, .. } => format!("its owner `{field}`"),
        OrderingKey::PathTop { field } => format!("the top of its path `{field}`"),
    }
}
