//! Reference model of any declared model: the plainest implementation of
//! what a model's commands mean (docs/model.md, "What commands do"),
//! independent of the worker and of any index. One copy of each document,
//! whatever its key; copies read from their owner at every write.
//!
//! - An upsert replaces the document, and takes each copy from its owner
//!   as the owner is now (no owner: the copy is empty).
//! - A patch sets the fields it names in a document that exists (of one
//!   that does not, it does nothing).
//! - An upsert or a patch of an owner rewrites the copies of every
//!   document that copies from it, in its tenant.
//! - A delete removes the document; its dependents keep their copies.
//! - A rename of a prefix renames the path of every document of the kind
//!   beneath it, in its tenant.
//! - An owner change is its upsert: here the document has one copy.

use std::collections::BTreeMap;

use crate::command::generic::{ModelCommand, ModelEnvelope, Object, Op, Value};
use crate::command::path;
use crate::domain::{Domain, FieldType, OwnerCopy};

/// A document's place: its tenant (`None`: the default), its kind, its id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DocKey {
    pub tenant: Option<String>,
    pub kind: String,
    pub id: String,
}

/// A document as the index should hold it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredDoc {
    /// Its declared fields and nested lists.
    pub fields: Object,
    /// By copy name: the owner's copied fields that the owner has.
    pub copies: BTreeMap<String, Object>,
}

#[derive(Debug, Clone)]
pub struct ModelReference {
    domain: Domain,
    docs: BTreeMap<DocKey, StoredDoc>,
}

impl ModelReference {
    pub fn new(domain: Domain) -> Self {
        ModelReference { domain, docs: BTreeMap::new() }
    }

    /// Applies a command checked against the model.
    pub fn apply(&mut self, e: &ModelEnvelope) {
        self.apply_command(&e.tenant, &e.command);
    }

    /// Applies `command` of `tenant` (all that [`ModelReference::apply`]
    /// reads of an envelope).
    pub fn apply_command(&mut self, tenant: &Option<String>, command: &ModelCommand) {
        let ModelCommand { kind, op } = command;
        let key = |id: &String| DocKey { tenant: tenant.clone(), kind: kind.clone(), id: id.clone() };
        match op {
            Op::Upsert { id, fields, .. } => self.write(key(id), fields.clone()),
            Op::Patch { id, set, .. } => {
                let Some(doc) = self.docs.get(&key(id)) else { return };
                let mut fields = doc.fields.clone();
                fields.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                self.write(key(id), fields);
            }
            Op::Delete { id, .. } => {
                self.docs.remove(&key(id));
            }
            Op::RenamePrefix { from, to } => {
                let Some(field) = self.domain.kind(kind).and_then(|k| k.fields.iter().find(|f| f.ty == FieldType::Path)).map(|f| f.name.clone()) else { return };
                for (_, doc) in self.docs.iter_mut().filter(|(k, _)| k.tenant == *tenant && &k.kind == kind) {
                    if let Some(Value::Str(p)) = doc.fields.get_mut(&field) {
                        if let Some(new) = path::renamed(p, from, to) {
                            *p = new;
                        }
                    }
                }
            }
        }
    }

    /// Writes a document with the copies it takes from its owners now, then
    /// rewrites the copies of the documents that copy from it.
    fn write(&mut self, key: DocKey, fields: Object) {
        let copies = self.copies_for(&key.tenant, &key.kind, &fields);
        self.docs.insert(key.clone(), StoredDoc { fields, copies });
        self.rewrite_dependents(&key);
    }

    /// Every document, by its place.
    pub fn docs(&self) -> &BTreeMap<DocKey, StoredDoc> {
        &self.docs
    }

    /// The copies a document of `kind` with `fields` takes from its owners.
    fn copies_for(&self, tenant: &Option<String>, kind: &str, fields: &Object) -> BTreeMap<String, Object> {
        let Some(k) = self.domain.kind(kind) else { return BTreeMap::new() };
        k.copies.iter().map(|c| (c.name.clone(), self.copy_from(tenant, c, fields))).collect()
    }

    /// What copy `c` carries of the owner that `fields` names.
    fn copy_from(&self, tenant: &Option<String>, c: &OwnerCopy, fields: &Object) -> Object {
        let Some(Value::Str(owner_id)) = fields.get(&c.via) else { return Object::new() };
        let owner = DocKey { tenant: tenant.clone(), kind: c.owner.clone(), id: owner_id.clone() };
        let Some(owner) = self.docs.get(&owner) else { return Object::new() };
        c.fields.iter().filter_map(|f| owner.fields.get(f).map(|v| (f.clone(), v.clone()))).collect()
    }

    /// Rewrites the copies of every document that copies from `owner`.
    fn rewrite_dependents(&mut self, owner: &DocKey) {
        let copying: Vec<(String, OwnerCopy)> = self.domain.kinds.iter().flat_map(|k| k.copies.iter().filter(|c| c.owner == owner.kind).map(move |c| (k.name.clone(), c.clone()))).collect();
        for (kind, c) in copying {
            let dependents: Vec<DocKey> =
                self.docs.iter().filter(|(k, d)| k.tenant == owner.tenant && k.kind == kind && d.fields.get(&c.via) == Some(&Value::Str(owner.id.clone()))).map(|(k, _)| k.clone()).collect();
            for k in dependents {
                let copy = self.copy_from(&owner.tenant, &c, &self.docs[&k].fields);
                self.docs.get_mut(&k).expect("listed").copies.insert(c.name.clone(), copy);
            }
        }
    }
}

pub mod legacy;

#[cfg(test)]
mod tests;
