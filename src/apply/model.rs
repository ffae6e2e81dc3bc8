//! A declared model's commands -> effects on its documents (docs/model.md,
//! "What commands do"), through the same [`Shard`] operations and position
//! guards as the compiled-in commands:
//!
//! - an upsert writes the document with the copies it takes from its
//!   owners as they are now (no owner: an empty copy);
//! - a patch sets fields of a document that exists (of one that does not,
//!   it does nothing);
//! - an upsert or a patch of an owner first rewrites the copies its
//!   dependents carry, then writes the owner (last: a command cut short
//!   still looks unapplied, and its retry finishes the dependents);
//! - a delete removes the document, its dependents keep their copies;
//! - a rename of a prefix renames the path of every document beneath it.
//!
//! A fan-out the worker can page ([`fan_out_scan`]) is a rename, or an
//! upsert of an owner whose copies one kind carries; the other fan-outs
//! scan within the command.

use std::collections::BTreeMap;

use crate::command::generic::bound::Bound;
use crate::command::generic::{Object, Op, Value};
use crate::command::{path, tenant};
use crate::domain::OwnerCopy;
use crate::index::{newer, put_guarded, CopyTarget, Doc, IndexError, Kind, ModelDoc, ModelKind, ModelScan, Origin, Scan, Shard, Wanted};

use super::FanOut;

fn kind_of(b: &Bound) -> ModelKind {
    ModelKind::of(b.domain, &b.command.kind).expect("a valid command names a kind of its model")
}

fn scoped(b: &Bound, id: &str) -> String {
    tenant::scope(b.tenant.as_deref(), id)
}

/// Applies a model's command found at `pos`. Returns the documents written.
pub(super) fn apply<S: Shard + ?Sized>(shard: &mut S, b: &Bound, pos: u64, fan_out: FanOut) -> Result<u64, IndexError> {
    let kind = kind_of(b);
    match &b.command.op {
        Op::Upsert { id, fields, .. } => {
            let mut written = 0;
            for scan in dependents(b, id, fields) {
                let scan = Scan::Model(scan);
                written += fan_out.rewrite(shard, &scan, &mut |d| rule(&scan, pos, d))?;
            }
            Ok(written + upsert(shard, b, pos)?)
        }
        Op::Patch { id, set, .. } => {
            let sid = scoped(b, id);
            let Some(Doc::Model(current)) = shard.get(Kind::Model(kind), &sid)? else { return Ok(0) };
            if !newer(pos, current.pos) {
                return Ok(0);
            }
            let mut fields = current.fields.clone();
            fields.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
            let mut written = 0;
            for scan in dependents(b, id, &fields) {
                let scan = Scan::Model(scan);
                written += fan_out.rewrite(shard, &scan, &mut |d| rule(&scan, pos, d))?;
            }
            let copies = copies_for(shard, b, &fields)?;
            Ok(written + put_guarded(shard, Doc::Model(Box::new(ModelDoc::new(kind, sid, fields, copies, pos))))?)
        }
        Op::Delete { id, .. } => super::delete_guarded(shard, Kind::Model(kind), &scoped(b, id), pos),
        Op::RenamePrefix { .. } => {
            let scan = fan_out_scan(b).expect("a rename scans");
            fan_out.rewrite(shard, &scan, &mut |d| fan_out_rule(b, pos, d))
        }
    }
}

/// The documents applying `b` reads first: its own (for its position
/// guard, or whole for a patch, a delete and an owner change's take-over)
/// and the owners it copies from.
pub(super) fn reads(b: &Bound) -> Vec<Wanted> {
    let kind = Kind::Model(kind_of(b));
    let owners = |fields: &Object| owner_reads(b, fields);
    match &b.command.op {
        Op::Upsert { id, fields, .. } => {
            let own = match b.previous_key() {
                None => Wanted::upsert(kind, &scoped(b, id)),
                Some(_) => Wanted::contents(kind, &scoped(b, id)),
            };
            std::iter::once(own).chain(owners(fields)).collect()
        }
        Op::Patch { id, .. } | Op::Delete { id, .. } => vec![Wanted::contents(kind, &scoped(b, id))],
        Op::RenamePrefix { .. } => Vec::new(),
    }
}

fn owner_reads(b: &Bound, fields: &Object) -> Vec<Wanted> {
    b.decl().copies.iter().filter_map(|c| owner_of(b, c, fields).map(|(k, id)| Wanted::contents(Kind::Model(k), &id))).collect()
}

/// The fan-out the worker can page: a rename's documents, or the one kind
/// of dependents of an upserted owner.
pub(super) fn fan_out_scan(b: &Bound) -> Option<Scan> {
    match &b.command.op {
        Op::RenamePrefix { from, .. } => {
            let field = b.decl().fields.iter().find(|f| f.ty == crate::domain::FieldType::Path).map(|f| f.name.clone())?;
            Some(Scan::Model(ModelScan::Within { key: b.key().to_string(), tenant: b.tenant.clone(), kind: kind_of(b), field, path: from.clone() }))
        }
        Op::Upsert { id, fields, .. } if b.dependent_kinds() == 1 => dependents(b, id, fields).into_iter().next().map(Scan::Model),
        _ => None,
    }
}

/// The scans of the dependents of the owner that `b` upserts or patches,
/// of every kind that copies from it ([`super::dependents_scans`]). A
/// patch's carry the fields it sets: whose dependents they read is what
/// reading them ahead needs.
pub(super) fn dependents_scans(b: &Bound) -> Vec<Scan> {
    let (id, fields) = match &b.command.op {
        Op::Upsert { id, fields, .. } => (id, fields),
        Op::Patch { id, set, .. } => (id, set),
        _ => return Vec::new(),
    };
    dependents(b, id, fields).into_iter().map(Scan::Model).collect()
}

/// The new version of a document [`fan_out_scan`]'s scan read, if it
/// changes.
pub(super) fn fan_out_rule(b: &Bound, pos: u64, doc: &Doc) -> Option<Doc> {
    let Doc::Model(d) = doc else { return None };
    if !newer(pos, d.pos) {
        return None;
    }
    match &b.command.op {
        Op::RenamePrefix { from, to } => {
            let field = b.decl().fields.iter().find(|f| f.ty == crate::domain::FieldType::Path)?;
            let Some(Value::Str(p)) = d.fields.get(&field.name) else { return None };
            let renamed = path::renamed(p, from, to)?;
            let mut fields = d.fields.clone();
            fields.insert(field.name.clone(), Value::Str(renamed));
            Some(Doc::Model(Box::new(ModelDoc::new(d.kind, d.id.clone(), fields, d.copies.clone(), pos))))
        }
        Op::Upsert { id, fields, .. } => {
            let c = d.kind.decl().copies.iter().find(|c| c.owner == b.command.kind && names(&d.fields, &c.via, id))?;
            recopied(d, &c.name, copy_values(c, fields), pos)
        }
        _ => None,
    }
}

/// What a fan-out writes once its scan is complete: an upserted owner.
pub(super) fn fan_out_finish<S: Shard + ?Sized>(shard: &mut S, b: &Bound, pos: u64) -> Result<u64, IndexError> {
    match &b.command.op {
        Op::Upsert { .. } => upsert(shard, b, pos),
        _ => Ok(0),
    }
}

/// The document of an upsert, with its copies: an owner change takes it
/// over from the key it leaves; any other upsert writes it unless this
/// shard holds a version at least as new.
fn upsert<S: Shard + ?Sized>(shard: &mut S, b: &Bound, pos: u64) -> Result<u64, IndexError> {
    let Op::Upsert { id, fields, .. } = &b.command.op else { return Ok(0) };
    let copies = copies_for(shard, b, fields)?;
    let doc = Doc::Model(Box::new(ModelDoc::new(kind_of(b), scoped(b, id), fields.clone(), copies, pos)));
    match b.previous_key() {
        Some(key) => shard.take_over(doc, &Origin { key, partition: None }),
        None => put_guarded(shard, doc),
    }
}

/// The copies a document of `b`'s kind with `fields` takes from its
/// owners as they are now.
fn copies_for<S: Shard + ?Sized>(shard: &mut S, b: &Bound, fields: &Object) -> Result<BTreeMap<String, Object>, IndexError> {
    let mut out = BTreeMap::new();
    for c in &b.decl().copies {
        let copy = match owner_of(b, c, fields) {
            Some((k, id)) => match shard.get(Kind::Model(k), &id)? {
                Some(Doc::Model(owner)) => copy_values(c, &owner.fields),
                _ => Object::new(),
            },
            None => Object::new(),
        };
        out.insert(c.name.clone(), copy);
    }
    Ok(out)
}

/// The owner copy `c` of a document with `fields` names: its kind and
/// scoped id.
fn owner_of(b: &Bound, c: &OwnerCopy, fields: &Object) -> Option<(ModelKind, String)> {
    let Some(Value::Str(id)) = fields.get(&c.via) else { return None };
    Some((ModelKind::of(b.domain, &c.owner)?, scoped(b, id)))
}

/// The fields of an owner's `fields` that copy `c` carries.
fn copy_values(c: &OwnerCopy, fields: &Object) -> Object {
    c.fields.iter().filter_map(|f| fields.get(f).map(|v| (f.clone(), v.clone()))).collect()
}

fn names(fields: &Object, field: &str, id: &str) -> bool {
    matches!(fields.get(field), Some(Value::Str(s)) if s == id)
}

/// The scans of every kind of dependents of the owner `id` of `b`'s kind,
/// each with the copy its documents carry of `fields`.
fn dependents(b: &Bound, id: &str, fields: &Object) -> Vec<ModelScan> {
    let mut out = Vec::new();
    for k in &b.domain.kinds {
        for c in k.copies.iter().filter(|c| c.owner == b.command.kind) {
            let Some(kind) = ModelKind::of(b.domain, &k.name) else { continue };
            let target = CopyTarget { kind, via: c.via.clone(), copy: c.name.clone(), values: copy_values(c, fields) };
            out.push(ModelScan::Dependents { key: b.key().to_string(), tenant: b.tenant.clone(), owner: id.to_string(), target });
        }
    }
    out
}

/// A dependent's new version with `values` as its copy `copy`, if that
/// changes it.
fn recopied(d: &ModelDoc, copy: &str, values: Object, pos: u64) -> Option<Doc> {
    if d.copies.get(copy) == Some(&values) {
        return None;
    }
    let mut copies = d.copies.clone();
    copies.insert(copy.to_string(), values);
    Some(Doc::Model(Box::new(ModelDoc { kind: d.kind, id: d.id.clone(), key: d.key.clone(), fields: d.fields.clone(), copies, pos })))
}

/// The rule of a scan of [`dependents`].
fn rule(scan: &Scan, pos: u64, doc: &Doc) -> Option<Doc> {
    let (Scan::Model(scan), Doc::Model(d)) = (scan, doc) else { return None };
    let target = scan.target_of(d)?;
    if !newer(pos, d.pos) {
        return None;
    }
    recopied(d, &target.copy, target.values.clone(), pos)
}
