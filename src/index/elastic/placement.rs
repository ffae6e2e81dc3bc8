//! Where a generation keeps each tenant's documents on Elasticsearch (see
//! docs/tenants.md, "Placements"):
//!
//! - **shared** (every tenant by default): the generation's index of each
//!   kind, `<prefix>-files-000001`, the tenant's documents routed by the
//!   tenant and told apart by the `tenant` field;
//! - **dedicated** (the tenants named in `DENORM_ES_DEDICATED_TENANTS`
//!   when the generation was created): indexes of the tenant's own,
//!   `<prefix>-t-<tenant>-files-000001`, written through
//!   `<prefix>-t-<tenant>-files-g0` and routed by `_id`.
//!
//! The placement is a property of a generation, recorded when the
//! generation is created (the meta document `placement`, `g<g>-placement`
//! after generation 0) and never changed: every writer of the generation
//! reads it when it opens a shard. A tenant moves between placements with
//! a rebuild, whose new generation is created with the placement the
//! configuration names then.
//!
//! A dedicated index carries the generation's read alias `<prefix>-files`
//! (so that every search, filtered by tenant as always, finds the
//! tenant's documents where they are) and the tenant's own read alias
//! `<prefix>-t-<tenant>-files`, the name the shared placement gives its
//! filtered alias: a tenant's application reads the same alias in either
//! placement.

use std::collections::BTreeSet;

use elasticsearch::Elasticsearch;
use serde_json::{json, Value};

use super::mapping::{mapping, settings};
use super::meta::{get_meta, put_meta_if};
use super::names::{alias, concrete, dedicated_concrete, dedicated_write_alias, meta_id, rebuild_alias, tenant_alias, write_alias, PLACEMENT};
use super::ElasticError;
use crate::index::Kind;

/// The tenants with indexes of their own in a generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    dedicated: BTreeSet<String>,
    /// How many times `denorm rebuild --tenant` replaced a tenant's own
    /// indexes (absent: never): which of them are current.
    revisions: std::collections::BTreeMap<String, u32>,
    /// A tenant's rebuild's writers: that tenant's documents go through
    /// the rebuild's alias of this revision instead (not recorded).
    building: Option<(String, u32)>,
    /// The tenants moving from the shared indexes into their own, between
    /// the fence and the cutover of `denorm rebuild --tenant`: dedicated
    /// (the live workers write them through their own write alias, on no
    /// index until the cutover), not yet searched there.
    entering: BTreeSet<String>,
    /// The tenants moved out of the shared indexes: the shared read alias
    /// hides their documents there (deleted after the move, unless kept).
    hidden: BTreeSet<String>,
    /// How many times a tenant moved: the live workers say in the index
    /// which placement they write with (see [`acknowledged_id`]).
    moves: u64,
    /// The tenants moving from their own indexes into the shared ones:
    /// dedicated until the cutover, their documents rebuilt into the
    /// shared indexes meanwhile, hidden there.
    leaving: BTreeSet<String>,
}

impl Placement {
    /// Every tenant in the shared indexes, except `dedicated`.
    pub fn new<S: Into<String>>(dedicated: impl IntoIterator<Item = S>) -> Self {
        Placement { dedicated: dedicated.into_iter().map(Into::into).collect(), ..Default::default() }
    }

    /// Whether the two place the same tenants in indexes of their own.
    pub fn same_tenants(&self, other: &Placement) -> bool {
        self.dedicated == other.dedicated
    }

    /// Which of `tenant`'s own indexes are current (see
    /// [`super::names::dedicated_concrete`]).
    pub fn revision(&self, tenant: &str) -> u32 {
        self.revisions.get(tenant).copied().unwrap_or(0)
    }

    /// The placement with `tenant`'s own indexes replaced by revision `rev`.
    pub fn with_revision(&self, tenant: &str, rev: u32) -> Placement {
        let mut p = self.clone();
        p.revisions.insert(tenant.to_string(), rev);
        p
    }

    /// The placement a tenant's rebuild of revision `rev` writes with.
    pub fn building(&self, tenant: &str, rev: u32) -> Placement {
        Placement { building: Some((tenant.to_string(), rev)), ..self.clone() }
    }

    /// The fence of `tenant`'s move from the shared indexes into revision
    /// `rev` of its own: dedicated from now on (the live workers' writes of
    /// it wait for its write alias), entering until the cutover, hidden
    /// in the shared indexes from the cutover on. A move counted.
    pub fn entering(&self, tenant: &str, rev: u32) -> Placement {
        let mut p = self.with_revision(tenant, rev);
        p.dedicated.insert(tenant.to_string());
        p.entering.insert(tenant.to_string());
        p.hidden.insert(tenant.to_string());
        p.moves += 1;
        p
    }

    /// `tenant`'s move cut over: no longer entering.
    pub fn entered(&self, tenant: &str) -> Placement {
        let mut p = self.clone();
        p.entering.remove(tenant);
        p
    }

    /// `tenant`'s move given up after its fence: back in the shared
    /// indexes, its revision back to `rev`. A move counted.
    pub fn not_entering(&self, tenant: &str, rev: u32) -> Placement {
        let mut p = self.with_revision(tenant, rev);
        for set in [&mut p.dedicated, &mut p.entering, &mut p.hidden] {
            set.remove(tenant);
        }
        if rev == 0 {
            p.revisions.remove(tenant);
        }
        p.moves += 1;
        p
    }

    /// A tenant's move from its own indexes into the shared ones begun: its
    /// documents rebuilt there are hidden until the cutover.
    pub fn leaving(&self, tenant: &str) -> Placement {
        let mut p = self.clone();
        p.leaving.insert(tenant.to_string());
        p.hidden.insert(tenant.to_string());
        p
    }

    /// `tenant`'s move into the shared indexes cut over: shared, no longer
    /// hidden there; its revision `rev` (what a later move back names its
    /// own indexes after). A move counted.
    pub fn left(&self, tenant: &str, rev: u32) -> Placement {
        let mut p = self.with_revision(tenant, rev);
        for set in [&mut p.dedicated, &mut p.leaving, &mut p.hidden] {
            set.remove(tenant);
        }
        p.moves += 1;
        p
    }

    /// `tenant`'s move into the shared indexes given up (its documents
    /// there deleted): as before it began.
    pub fn not_leaving(&self, tenant: &str) -> Placement {
        let mut p = self.clone();
        p.leaving.remove(tenant);
        p.hidden.remove(tenant);
        p
    }

    /// Whether `tenant` is moving from its own indexes into the shared ones.
    pub fn is_leaving(&self, tenant: &str) -> bool {
        self.leaving.contains(tenant)
    }

    /// `tenant`'s documents deleted from the shared indexes after its move:
    /// nothing of it left there to hide.
    pub fn unhidden(&self, tenant: &str) -> Placement {
        let mut p = self.clone();
        p.hidden.remove(tenant);
        p
    }

    /// Whether `tenant` is moving in from the shared indexes (fenced, not
    /// cut over).
    pub fn is_entering(&self, tenant: &str) -> bool {
        self.entering.contains(tenant)
    }

    /// Whether `tenant` moved out of the shared indexes, its documents
    /// there hidden.
    pub fn is_hidden(&self, tenant: &str) -> bool {
        self.hidden.contains(tenant)
    }

    /// How many times a tenant moved between placements.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// The tenants whose documents in the shared indexes are hidden: moved
    /// out, and cut over (until its cutover, a tenant moving out is read
    /// there).
    fn hidden_now(&self) -> Vec<&str> {
        self.hidden.iter().filter(|t| !self.entering.contains(*t)).map(String::as_str).collect()
    }

    /// The shared indexes' read alias: tombstones hidden, and the
    /// documents of the tenants moved out.
    pub fn shared_read_alias(&self) -> Value {
        let mut def = super::mapping::read_alias();
        let hidden = self.hidden_now();
        if !hidden.is_empty() {
            def["filter"]["bool"]["must_not"].as_array_mut().expect("the read alias filters").push(json!({"terms": {super::names::TENANT_FIELD: hidden}}));
        }
        def
    }

    /// What the shared read alias hides, as a clause to exclude from a
    /// search that names generation `g`'s shared index of `kind` rather
    /// than the alias (`None`: nothing hidden).
    pub fn hidden_by_name(&self, prefix: &str, kind: Kind, g: u64) -> Option<Value> {
        let hidden = self.hidden_now();
        (!hidden.is_empty()).then(|| json!({"bool": {"filter": [{"terms": {super::names::TENANT_FIELD: hidden}}, {"term": {"_index": concrete(prefix, kind, g)}}]}}))
    }

    /// The tenants with indexes of their own in this generation, now or
    /// before (a revision recorded).
    pub fn tenants_placed(&self) -> impl Iterator<Item = &str> {
        self.dedicated().chain(self.revisions.keys().map(String::as_str))
    }

    /// The tenants with indexes of their own, in order.
    pub fn dedicated(&self) -> impl Iterator<Item = &str> {
        self.dedicated.iter().map(String::as_str)
    }

    /// Whether `tenant` (`None`: the default tenant, always shared) has
    /// indexes of its own.
    pub fn is_dedicated(&self, tenant: Option<&str>) -> bool {
        tenant.is_some_and(|t| self.dedicated.contains(t))
    }

    /// The alias generation `g`'s writers read and write `tenant`'s
    /// documents of `kind` through.
    pub fn write_target(&self, prefix: &str, kind: Kind, g: u64, tenant: Option<&str>) -> String {
        match (tenant, &self.building) {
            (Some(t), Some((b, rev))) if t == b && self.leaving.contains(t) => shared_rebuild_alias(prefix, t, kind, g, *rev),
            (Some(t), Some((b, rev))) if t == b => rebuild_alias(prefix, t, kind, g, *rev),
            (Some(t), _) if self.dedicated.contains(t) => dedicated_write_alias(prefix, t, kind, g),
            _ => write_alias(prefix, kind, g),
        }
    }

    /// Every concrete index of `kind` in generation `g`: the shared one
    /// first, then the tenants' own.
    pub fn indexes(&self, prefix: &str, kind: Kind, g: u64) -> Vec<String> {
        std::iter::once(concrete(prefix, kind, g)).chain(self.dedicated().map(|t| dedicated_concrete(prefix, t, kind, g, self.revision(t)))).collect()
    }

    /// The indexes of `kind` in generation `g` a search reads: those of
    /// [`Self::indexes`] but the own indexes of a tenant moving into them,
    /// read in the shared ones until its cutover.
    pub fn searched(&self, prefix: &str, kind: Kind, g: u64) -> Vec<String> {
        let own = self.dedicated().filter(|t| !self.entering.contains(*t));
        std::iter::once(concrete(prefix, kind, g)).chain(own.map(|t| dedicated_concrete(prefix, t, kind, g, self.revision(t)))).collect()
    }

    /// Every concrete index of generation `g`, of each of `kinds`.
    pub fn all_indexes(&self, prefix: &str, g: u64, kinds: &[Kind]) -> Vec<String> {
        kinds.iter().flat_map(|k| self.indexes(prefix, *k, g)).collect()
    }

    /// Every write alias of generation `g`, of each of `kinds`: those of
    /// a tenant's rebuild too, whether the tenant has indexes of its own
    /// yet or not (a move into them, before its fence), so that its
    /// writers' refreshes cover what they write.
    pub fn write_aliases(&self, prefix: &str, g: u64, kinds: &[Kind]) -> Vec<String> {
        let building = self.building.as_ref().map(|(t, _)| t.as_str()).filter(|t| !self.dedicated.contains(*t));
        let tenants = std::iter::once(None).chain(self.dedicated().map(Some)).chain(building.map(Some));
        tenants.flat_map(|t| kinds.iter().map(move |k| self.write_target(prefix, *k, g, t))).collect()
    }

    /// As recorded; the fields of moves only once a tenant has moved (a
    /// placement without moves reads as before they existed).
    fn to_json(&self) -> Value {
        let mut v = json!({ "dedicated": self.dedicated, "revisions": self.revisions });
        if self.moves > 0 || !self.leaving.is_empty() {
            v["entering"] = json!(self.entering);
            v["hidden"] = json!(self.hidden);
            v["moves"] = json!(self.moves);
            v["leaving"] = json!(self.leaving);
        }
        v
    }

    fn from_json(v: &Value) -> Result<Self, ElasticError> {
        let names = v["dedicated"].as_array().ok_or_else(|| ElasticError::Config(format!("the placement document has no list of dedicated tenants: {v}")))?;
        let mut dedicated = BTreeSet::new();
        for n in names {
            let t = n.as_str().ok_or_else(|| ElasticError::Config(format!("the placement document names a tenant that is not a string: {n}")))?;
            dedicated.insert(t.to_string());
        }
        fn field<T: serde::de::DeserializeOwned + Default>(v: &Value, name: &str) -> Result<T, ElasticError> {
            // Absent in placements recorded before the field existed.
            v.get(name).map_or(Ok(T::default()), |f| serde_json::from_value(f.clone())).map_err(|e| ElasticError::Config(format!("the placement document's {name}: {e}: {v}")))
        }
        let (revisions, entering, hidden, moves, leaving) = (field(v, "revisions")?, field(v, "entering")?, field(v, "hidden")?, field(v, "moves")?, field(v, "leaving")?);
        Ok(Placement { dedicated, revisions, building: None, entering, hidden, moves, leaving })
    }

    /// The `_aliases` actions of a cutover from generation `from` (placed
    /// as `self`) to `to` (placed as `next`) on the tenants' own indexes:
    /// `from`'s lose their aliases, `to`'s get the read aliases. The
    /// shared indexes' actions are [`super::generations::cutover_actions`].
    /// `kinds`: those of `from`, then those of `to`.
    pub fn cutover_actions(&self, next: &Placement, prefix: &str, (from, to): (u64, u64), kinds: (&[Kind], &[Kind])) -> Vec<Value> {
        let mut out = Vec::new();
        for t in self.dedicated() {
            for &kind in kinds.0 {
                let index = dedicated_concrete(prefix, t, kind, from, self.revision(t));
                for name in [alias(prefix, kind), tenant_alias(prefix, t, kind), dedicated_write_alias(prefix, t, kind, from)] {
                    out.push(json!({"remove": {"index": index, "alias": name}}));
                }
            }
        }
        for t in next.dedicated() {
            for &kind in kinds.1 {
                let index = dedicated_concrete(prefix, t, kind, to, next.revision(t));
                for (name, def) in read_aliases(prefix, t, kind) {
                    let mut add = def;
                    add["index"] = json!(index);
                    add["alias"] = json!(name);
                    out.push(json!({ "add": add }));
                }
            }
        }
        out
    }
}

/// The read aliases a tenant's own index of `kind` carries, with their
/// definitions: the generation's read alias (not its write index: the
/// shared index is) and the tenant's. Both hide tombstones.
pub fn read_aliases(prefix: &str, tenant: &str, kind: Kind) -> [(String, Value); 2] {
    let filter = super::mapping::read_alias()["filter"].clone();
    [(alias(prefix, kind), json!({"filter": filter, "is_write_index": false})), (tenant_alias(prefix, tenant, kind), json!({"filter": filter}))]
}

/// The `_aliases` actions that cut `tenant` over from revision `from` of
/// its own indexes in generation `g` to revision `to` (the live writers
/// fenced off `from` already, see `crate::index::tenant_generations`): the
/// read alias and the tenant's move, the live write alias goes on `to`,
/// and the rebuild's alias goes; of each of `kinds`.
pub fn revision_cutover_actions(prefix: &str, tenant: &str, g: u64, (from, to): (u32, u32), kinds: &[Kind]) -> Vec<Value> {
    let mut actions = Vec::new();
    for &kind in kinds {
        let old = dedicated_concrete(prefix, tenant, kind, g, from);
        for name in [alias(prefix, kind), tenant_alias(prefix, tenant, kind)] {
            actions.push(json!({"remove": {"index": old, "alias": name}}));
        }
        actions.extend(onto_rebuilt(prefix, tenant, kind, g, to));
    }
    actions
}

/// The `_aliases` actions that give revision `rev` of `tenant`'s own index
/// of `kind` in generation `g`, rebuilt, what the live revision has: the
/// read aliases and the live write alias, the rebuild's alias taken off.
fn onto_rebuilt(prefix: &str, tenant: &str, kind: Kind, g: u64, rev: u32) -> Vec<Value> {
    let index = dedicated_concrete(prefix, tenant, kind, g, rev);
    let mut actions = Vec::new();
    for (name, def) in read_aliases(prefix, tenant, kind) {
        let mut add = def;
        add["index"] = json!(index);
        add["alias"] = json!(name);
        actions.push(json!({ "add": add }));
    }
    actions.push(json!({"add": {"index": index, "alias": dedicated_write_alias(prefix, tenant, kind, g)}}));
    actions.push(json!({"remove": {"index": index, "alias": rebuild_alias(prefix, tenant, kind, g, rev)}}));
    actions
}

/// The `_aliases` actions that cut `tenant` over from generation `g`'s
/// shared indexes into revision `rev` of its own (the live writers fenced
/// already, see `crate::index::tenant_generations`): its own indexes get
/// the read aliases and the live write alias, the rebuild's alias goes,
/// the shared indexes' read alias becomes `shared_read` (hiding the
/// tenant), and the tenant's filtered alias leaves the shared indexes
/// where `filtered` (the names found on them) says it is; of each of
/// `kinds`.
pub fn entering_cutover_actions(prefix: &str, tenant: &str, g: u64, rev: u32, (shared_read, filtered): (&Value, &[String]), kinds: &[Kind]) -> Vec<Value> {
    let mut actions = Vec::new();
    for &kind in kinds {
        let shared = concrete(prefix, kind, g);
        let name = tenant_alias(prefix, tenant, kind);
        if filtered.contains(&name) {
            actions.push(json!({"remove": {"index": shared, "alias": name}}));
        }
        actions.push(shared_read_action(prefix, kind, g, shared_read));
        actions.extend(onto_rebuilt(prefix, tenant, kind, g, rev));
    }
    actions
}

/// The `_aliases` actions that cut `tenant` over from revision `rev` of its
/// own indexes in generation `g` into the shared ones, where its rebuild
/// wrote it (the live writers fenced already): its own indexes lose the
/// read aliases, the shared indexes' read alias becomes `shared_read`
/// (showing the tenant), the tenant's filtered alias goes on them, and the
/// rebuild's alias of revision `to` goes; of each of `kinds`.
pub fn leaving_cutover_actions(prefix: &str, tenant: &str, g: u64, (from, to): (u32, u32), shared_read: &Value, kinds: &[Kind]) -> Vec<Value> {
    let mut actions = Vec::new();
    for &kind in kinds {
        let (shared, own) = (concrete(prefix, kind, g), dedicated_concrete(prefix, tenant, kind, g, from));
        for name in [alias(prefix, kind), tenant_alias(prefix, tenant, kind)] {
            actions.push(json!({"remove": {"index": own, "alias": name}}));
        }
        actions.push(shared_read_action(prefix, kind, g, shared_read));
        actions.push(super::tenants::alias_action(&shared, &tenant_alias(prefix, tenant, kind), tenant));
        actions.push(json!({"remove": {"index": shared, "alias": shared_rebuild_alias(prefix, tenant, kind, g, to)}}));
    }
    actions
}

/// The `_aliases` action that (re)defines the read alias of generation
/// `g`'s shared index of `kind` as `def`.
pub fn shared_read_action(prefix: &str, kind: Kind, g: u64, def: &Value) -> Value {
    let mut add = def.clone();
    add["index"] = json!(concrete(prefix, kind, g));
    add["alias"] = json!(alias(prefix, kind));
    json!({ "add": add })
}

/// The alias a rebuild moving `tenant` into the shared indexes writes its
/// documents of `kind` through (on the shared index of generation `g`,
/// routed by the tenant): not named as a tenant's own.
pub fn shared_rebuild_alias(prefix: &str, tenant: &str, kind: Kind, g: u64, rev: u32) -> String {
    format!("{}-r{rev}-for-{tenant}", write_alias(prefix, kind, g))
}

/// The meta document in which the live writer of `partition` says which
/// placement of generation `g` it writes with (its count of moves).
pub fn acknowledged_id(g: u64, partition: i32) -> String {
    meta_id(g, &format!("placed-p{partition}"))
}

/// The body that creates `tenant`'s own index of `kind` in generation `g`,
/// with its write alias and, for a generation searched at once (the first
/// one), its read aliases.
pub fn create_body(prefix: &str, tenant: &str, kind: Kind, g: u64, with_read_aliases: bool) -> Value {
    let mut aliases = json!({ dedicated_write_alias(prefix, tenant, kind, g): {} });
    if with_read_aliases {
        for (name, def) in read_aliases(prefix, tenant, kind) {
            aliases[name] = def;
        }
    }
    json!({ "settings": settings(), "mappings": mapping(kind), "aliases": aliases })
}

/// The body that creates revision `rev` of `tenant`'s own index of `kind`
/// in generation `g` for its rebuild: written through the rebuild's alias
/// only, until the cutover gives it the others.
pub fn rebuild_body(prefix: &str, tenant: &str, kind: Kind, g: u64, rev: u32) -> Value {
    json!({ "settings": settings(), "mappings": mapping(kind), "aliases": { rebuild_alias(prefix, tenant, kind, g, rev): {} } })
}

/// Generation `g`'s placement as recorded (none recorded: every tenant
/// shared, as before placements existed).
pub async fn read(client: &Elasticsearch, prefix: &str, g: u64) -> Result<Placement, ElasticError> {
    match get_meta(client, prefix, &meta_id(g, PLACEMENT)).await? {
        Some(v) => Placement::from_json(&v),
        None => Ok(Placement::default()),
    }
}

/// Changes generation `g`'s recorded placement by `change` (`None`:
/// nothing to change), written on condition that it is still the version
/// read: a placement another tenant's rebuild changed meanwhile is read and
/// changed again, never overwritten. The placement recorded afterwards.
pub async fn update(client: &Elasticsearch, prefix: &str, g: u64, change: impl Fn(&Placement) -> Option<Placement>) -> Result<Placement, ElasticError> {
    let id = meta_id(g, PLACEMENT);
    loop {
        let (current, version) = match super::meta::get_source(client, &super::names::meta_index(prefix), &id).await? {
            Some((v, version)) => (Placement::from_json(&v)?, Some(version)),
            None => (Placement::default(), None),
        };
        let Some(next) = change(&current) else { return Ok(current) };
        if put_meta_if(client, prefix, &id, next.to_json(), version).await?.is_some() {
            return Ok(next);
        }
    }
}

/// Records `wanted` as generation `g`'s placement, unless one is recorded
/// already (another worker's first start, a resumed rebuild): the one
/// recorded is returned, and it is what the generation is built with.
pub async fn record(client: &Elasticsearch, prefix: &str, g: u64, wanted: &Placement) -> Result<Placement, ElasticError> {
    let id = meta_id(g, PLACEMENT);
    if put_meta_if(client, prefix, &id, wanted.to_json(), None).await?.is_some() {
        return Ok(wanted.clone());
    }
    match get_meta(client, prefix, &id).await? {
        Some(v) => Placement::from_json(&v),
        None => Err(ElasticError::Transport(format!("{id}: created by another writer, then gone"))),
    }
}

/// Where `DENORM_ES_DEDICATED_TENANTS` differs from the current
/// generation's placement: a line for the startup's warning (`None`: they
/// agree).
pub fn differs(configured: &Placement, current: &Placement, g: u64) -> Option<String> {
    if configured.same_tenants(current) {
        return None;
    }
    let list = |p: &Placement| if p.dedicated.is_empty() { "none".to_string() } else { p.dedicated().collect::<Vec<_>>().join(",") };
    Some(format!(
        "DENORM_ES_DEDICATED_TENANTS names {}, but generation {g} gives indexes of their own to {}: a generation keeps the placement it was created with, and `denorm rebuild` builds the next one with the configured placement",
        list(configured),
        list(current)
    ))
}

#[cfg(test)]
mod tests;
