//! Random logs of the shop model (`models/shop.toml`) as its producers
//! write them: customers upserted, patched and deleted; orders with lines
//! and tickets that copy their customer; products in a category tree,
//! renamed by prefix; owner changes of orders and products. Each command
//! is valid, names the document's key as it is now, and an owner change
//! carries the key it leaves. A document keeps the key a command named it
//! under, even deleted or never written (a patch or a delete of an unknown
//! id names one): written again under another, it changes owner in the
//! explicit form, as the protocol asks (docs/cross-key.md, "Owner
//! changes"), and a replay orders the two keys' commands as they were sent.

use std::collections::BTreeMap;

use denorm::command::generic::{ModelCommand, ModelEnvelope, Object, Op, Value};
use denorm::domain::Domain;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn model() -> Domain {
    Domain::parse("shop.toml", include_str!("../../../models/shop.toml")).unwrap()
}

fn s(v: impl Into<String>) -> Value {
    Value::Str(v.into())
}

/// A generator that remembers each document's key, per tenant.
pub struct ShopLog {
    rng: StdRng,
    /// (tenant, kind, id) -> the key field's value now.
    keys: BTreeMap<(Option<String>, &'static str, String), String>,
    /// The tenants whose documents it writes.
    tenants: Vec<Option<String>>,
}

const TENANTS: [Option<&str>; 2] = [None, Some("acme")];
const TOPS: [&str; 2] = ["/garden", "/home"];
const CATEGORIES: [&str; 3] = ["tools", "seeds", "kit"];

impl ShopLog {
    /// Commands of the default tenant and of `acme`.
    pub fn new(seed: u64) -> Self {
        ShopLog::of_tenants(seed, TENANTS.iter().map(|t| t.map(str::to_string)).collect())
    }

    /// Commands of `tenants` alone: producers that write at once, each its
    /// own tenants, never name one document under two keys.
    pub fn of_tenants(seed: u64, tenants: Vec<Option<String>>) -> Self {
        ShopLog { rng: StdRng::seed_from_u64(seed), keys: BTreeMap::new(), tenants }
    }

    /// `n` commands; an owner change comes as its two halves (the delete
    /// under the key it leaves, then the upsert), as they reach the topic.
    pub fn commands(&mut self, d: &Domain, n: usize) -> Vec<ModelEnvelope> {
        let mut out = Vec::new();
        while out.len() < n {
            let e = self.next(d);
            if let Some(delete) = e.command.owner_change_delete(d.kind(&e.command.kind).unwrap()) {
                out.push(ModelEnvelope::new(delete, e.tenant.clone()));
            }
            out.push(e);
        }
        out
    }

    /// `n` commands as a producer writes them in JSONL: an owner change is
    /// its upsert naming the key it leaves (`denorm produce` sends the
    /// delete half first).
    pub fn written(&mut self, d: &Domain, n: usize) -> Vec<ModelEnvelope> {
        (0..n).map(|_| self.next(d)).collect()
    }

    fn next(&mut self, d: &Domain) -> ModelEnvelope {
        let tenant = self.tenants[self.rng.random_range(0..self.tenants.len())].clone();
        let command = self.command(&tenant);
        let e = ModelEnvelope::new(command, tenant);
        e.validate(d).unwrap_or_else(|err| panic!("the generator wrote an invalid command: {err}: {e:?}"));
        e
    }

    fn id(&mut self, prefix: &str, n: u32) -> String {
        format!("{prefix}{}", self.rng.random_range(0..n))
    }

    fn customer_fields(&mut self, all: bool) -> Object {
        let mut o = Object::new();
        let names = ["Ann Lee", "Bob Stone", "Cy Young", "Di Park"];
        if all || self.rng.random_bool(0.6) {
            o.insert("name".into(), s(names[self.rng.random_range(0..names.len())]));
        }
        if all || self.rng.random_bool(0.6) {
            o.insert("plan".into(), s(["free", "gold", "team"][self.rng.random_range(0..3)]));
        }
        if all || o.is_empty() {
            o.insert("since".into(), s(format!("2026-0{}-1{}", self.rng.random_range(1..10), self.rng.random_range(0..10))));
        }
        o
    }

    fn line(&mut self) -> Object {
        let mut l = Object::new();
        l.insert("sku".into(), s(format!("sku-{}", self.rng.random_range(0..4))));
        l.insert("quantity".into(), Value::Int(self.rng.random_range(1..5)));
        l.insert("price".into(), Value::Float(self.rng.random_range(1..40) as f64 / 2.0));
        l
    }

    fn product_path(&mut self, top: &str) -> String {
        format!("{top}/{}/p-{}", CATEGORIES[self.rng.random_range(0..CATEGORIES.len())], self.rng.random_range(0..100))
    }

    fn command(&mut self, tenant: &Option<String>) -> ModelCommand {
        let c = |kind: &str, op| ModelCommand { kind: kind.into(), op };
        let key = |me: &Self, kind: &'static str, id: &str| me.keys.get(&(tenant.clone(), kind, id.to_string())).cloned();
        match self.rng.random_range(0..100) {
            0..=11 => c("customer", Op::Upsert { id: self.id("c", 4), fields: self.customer_fields(true), previous: None }),
            12..=23 => c("customer", Op::Patch { id: self.id("c", 4), at: None, set: self.customer_fields(false) }),
            24..=27 => c("customer", Op::Delete { id: self.id("c", 4), at: None }),
            28..=45 => {
                let id = self.id("o", 8);
                let customer = self.id("c", 4);
                let mut fields = Object::new();
                fields.insert("customer_id".into(), s(customer.clone()));
                fields.insert("placed".into(), s("2026-12-04T10:00:00Z"));
                fields.insert("status".into(), s("open"));
                fields.insert("total".into(), Value::Float(self.rng.random_range(0..100) as f64));
                if self.rng.random_bool(0.3) {
                    fields.insert("note".into(), s("leave at the door"));
                }
                let lines = (0..self.rng.random_range(0..3)).map(|_| self.line()).collect();
                fields.insert("lines".into(), Value::Objects(lines));
                let previous = key(self, "order", &id).filter(|k| *k != customer);
                self.keys.insert((tenant.clone(), "order", id.clone()), customer);
                c("order", Op::Upsert { id, fields, previous })
            }
            46..=53 => {
                let id = self.id("o", 8);
                let at = key(self, "order", &id).unwrap_or_else(|| "c0".into());
                self.keys.insert((tenant.clone(), "order", id.clone()), at.clone());
                let mut set = Object::new();
                set.insert("status".into(), s(["shipped", "open", "returned"][self.rng.random_range(0..3)]));
                if self.rng.random_bool(0.4) {
                    set.insert("lines".into(), Value::Objects(vec![self.line()]));
                }
                c("order", Op::Patch { id, at: Some(at), set })
            }
            54..=57 => {
                let id = self.id("o", 8);
                let at = key(self, "order", &id).unwrap_or_else(|| "c1".into());
                self.keys.insert((tenant.clone(), "order", id.clone()), at.clone());
                c("order", Op::Delete { id, at: Some(at) })
            }
            58..=65 => {
                let id = self.id("t", 4);
                // A ticket stays with its customer: it never changes owner.
                let customer = key(self, "ticket", &id).unwrap_or_else(|| self.id("c", 4));
                self.keys.insert((tenant.clone(), "ticket", id.clone()), customer.clone());
                let mut fields = Object::new();
                fields.insert("customer_id".into(), s(customer));
                fields.insert("subject".into(), s(["Broken rake", "Late delivery", "Refunds"][self.rng.random_range(0..3)]));
                fields.insert("open".into(), Value::Bool(self.rng.random_bool(0.5)));
                c("ticket", Op::Upsert { id, fields, previous: None })
            }
            66..=69 => {
                let id = self.id("t", 4);
                let at = key(self, "ticket", &id).unwrap_or_else(|| "c2".into());
                self.keys.insert((tenant.clone(), "ticket", id.clone()), at.clone());
                let mut set = Object::new();
                set.insert("open".into(), Value::Bool(self.rng.random_bool(0.5)));
                c("ticket", Op::Patch { id, at: Some(at), set })
            }
            70..=84 => {
                let id = self.id("p", 6);
                let old = key(self, "product", &id);
                let top = TOPS[self.rng.random_range(0..TOPS.len())];
                let path = self.product_path(top);
                let previous = old.filter(|p| !p.starts_with(&format!("{top}/")));
                self.keys.insert((tenant.clone(), "product", id.clone()), path.clone());
                let mut fields = Object::new();
                fields.insert("path".into(), s(path));
                fields.insert("title".into(), s(["Steel rake", "Tomato seeds", "Garden kit"][self.rng.random_range(0..3)]));
                fields.insert("price".into(), Value::Float(self.rng.random_range(1..50) as f64));
                fields.insert("stock".into(), Value::Int(self.rng.random_range(0..9)));
                fields.insert("tags".into(), Value::List((0..self.rng.random_range(0..3)).map(|i| format!("tag-{i}")).collect()));
                c("product", Op::Upsert { id, fields, previous })
            }
            85..=89 => {
                let id = self.id("p", 6);
                let at = key(self, "product", &id).unwrap_or_else(|| "/garden/tools/p-1".into());
                self.keys.insert((tenant.clone(), "product", id.clone()), at.clone());
                let mut set = Object::new();
                set.insert("stock".into(), Value::Int(self.rng.random_range(0..9)));
                c("product", Op::Patch { id, at: Some(at), set })
            }
            90..=92 => {
                let id = self.id("p", 6);
                let at = key(self, "product", &id).unwrap_or_else(|| "/home/kit/p-2".into());
                self.keys.insert((tenant.clone(), "product", id.clone()), at.clone());
                c("product", Op::Delete { id, at: Some(at) })
            }
            _ => {
                let top = TOPS[self.rng.random_range(0..TOPS.len())];
                let (from, to) = {
                    let a = self.rng.random_range(0..CATEGORIES.len());
                    let b = (a + self.rng.random_range(1..CATEGORIES.len())) % CATEGORIES.len();
                    (format!("{top}/{}", CATEGORIES[a]), format!("{top}/{}", CATEGORIES[b]))
                };
                for ((t, kind, _), path) in self.keys.iter_mut() {
                    if t == tenant && *kind == "product" {
                        if let Some(rest) = path.strip_prefix(&from).filter(|r| r.starts_with('/')) {
                            *path = format!("{to}{rest}");
                        }
                    }
                }
                c("product", Op::RenamePrefix { from, to })
            }
        }
    }
}
