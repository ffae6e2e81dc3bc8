use super::super::names::KINDS;
use super::*;

#[test]
fn a_dedicated_tenant_is_written_to_its_own_indexes_and_the_others_to_the_shared_ones() {
    let p = Placement::new(["acme"]);
    assert_eq!(p.write_target("denorm", Kind::File, 2, Some("acme")), "denorm-t-acme-files-g2");
    assert_eq!(p.write_target("denorm", Kind::File, 2, Some("globex")), "denorm-files-g2");
    assert_eq!(p.write_target("denorm", Kind::Post, 0, None), "denorm-posts-g0");
    assert!(!p.is_dedicated(None));
    assert_eq!(p.indexes("denorm", Kind::User, 0), vec!["denorm-users-000001", "denorm-t-acme-users-000001"]);
    assert_eq!(p.write_aliases("denorm", 1, &KINDS).len(), 6);
    assert_eq!(Placement::from_json(&p.to_json()).unwrap(), p);
    assert_eq!(Placement::default().indexes("denorm", Kind::File, 0), vec!["denorm-files-000001"]);
    assert!(Placement::from_json(&json!({"dedicated": [1]})).is_err());
    // A tenant's rebuild: its writers write through their own alias,
    // and its cutover makes the new revision the current one.
    assert_eq!(p.building("acme", 2).write_target("denorm", Kind::File, 1, Some("acme")), "denorm-t-acme-files-g1-r2");
    assert_eq!(p.building("acme", 2).write_target("denorm", Kind::File, 1, Some("globex")), "denorm-files-g1");
    let rebuilt = p.with_revision("acme", 2);
    assert_eq!(rebuilt.indexes("denorm", Kind::File, 1), vec!["denorm-files-000002", "denorm-t-acme-files-000002-r2"]);
    assert_eq!(Placement::from_json(&rebuilt.to_json()).unwrap(), rebuilt);
    assert_eq!(Placement::from_json(&json!({"dedicated": ["acme"]})).unwrap(), p, "recorded before revisions");
}

#[test]
fn a_cutover_takes_the_aliases_off_the_old_tenants_indexes_and_puts_them_on_the_new() {
    let from = Placement::new(["acme"]);
    let to = Placement::new(["globex"]);
    let actions = from.cutover_actions(&to, "denorm", (0, 1), (&KINDS, &KINDS));
    let files: Vec<&Value> = actions.iter().filter(|a| a.to_string().contains("-files")).collect();
    assert_eq!(
        files,
        vec![
            &json!({"remove": {"index": "denorm-t-acme-files-000001", "alias": "denorm-files"}}),
            &json!({"remove": {"index": "denorm-t-acme-files-000001", "alias": "denorm-t-acme-files"}}),
            &json!({"remove": {"index": "denorm-t-acme-files-000001", "alias": "denorm-t-acme-files-g0"}}),
            &json!({"add": {"index": "denorm-t-globex-files-000002", "alias": "denorm-files", "is_write_index": false, "filter": {"bool": {"must_not": [{"term": {"denorm_deleted": true}}]}}}}),
            &json!({"add": {"index": "denorm-t-globex-files-000002", "alias": "denorm-t-globex-files", "filter": {"bool": {"must_not": [{"term": {"denorm_deleted": true}}]}}}}),
        ]
    );
    assert_eq!(actions.len(), 15);
    let body = create_body("denorm", "acme", Kind::File, 0, true);
    assert!(body["aliases"]["denorm-t-acme-files-g0"].is_object());
    assert_eq!(body["aliases"]["denorm-files"]["is_write_index"], json!(false));
    assert!(create_body("denorm", "acme", Kind::File, 1, false)["aliases"].get("denorm-files").is_none());
}

/// A model's kinds have a tenant's own indexes like the compiled-in
/// ones: a cutover into a generation holding a model puts their
/// aliases on the tenant's own indexes of them, and a cutover out of
/// it takes them off.
#[test]
fn a_tenants_own_indexes_of_a_models_kinds_are_cut_over_like_the_compiled_in_ones() {
    let d = crate::domain::tests::shop().interned();
    let with_model = super::super::names::kinds(Some(d));
    let order = Kind::Model(crate::index::ModelKind::of(d, "order").unwrap());
    let on_order = |actions: &[Value]| -> Vec<String> {
        actions
            .iter()
            .filter(|a| a.to_string().contains("-order"))
            .map(|a| a.as_object().unwrap().iter().map(|(op, b)| format!("{op} {} {}", b["alias"].as_str().unwrap(), b["index"].as_str().unwrap())).collect())
            .collect()
    };
    let into = Placement::new(["acme"]).cutover_actions(&Placement::new(["acme"]), "denorm", (0, 1), (&KINDS, &with_model));
    assert_eq!(on_order(&into), ["add denorm-order denorm-t-acme-order-000002", "add denorm-t-acme-order denorm-t-acme-order-000002"]);
    let out = Placement::new(["acme"]).cutover_actions(&Placement::default(), "denorm", (1, 2), (&with_model, &KINDS));
    assert_eq!(on_order(&out), ["remove denorm-order denorm-t-acme-order-000002", "remove denorm-t-acme-order denorm-t-acme-order-000002", "remove denorm-t-acme-order-g1 denorm-t-acme-order-000002"]);
    let revision = revision_cutover_actions("denorm", "acme", 1, (0, 1), &with_model);
    assert_eq!(revision.len(), 6 * with_model.len());
    assert!(on_order(&revision).contains(&"add denorm-t-acme-order-g1 denorm-t-acme-order-000002-r1".to_string()), "{revision:?}");
    assert_eq!(Placement::new(["acme"]).write_target("denorm", order, 1, Some("acme")), "denorm-t-acme-order-g1");
    assert_eq!(Placement::new(["acme"]).write_aliases("denorm", 1, &with_model).len(), 2 * with_model.len());
}

/// The actions on files' aliases, as `op alias index`.
fn of_files(actions: &[Value]) -> Vec<String> {
    actions
        .iter()
        .filter(|a| a.to_string().contains("-files"))
        .map(|a| {
            let (op, body) = a.as_object().unwrap().iter().next().unwrap();
            format!("{op} {} {}", body["alias"].as_str().unwrap(), body["index"].as_str().unwrap())
        })
        .collect()
}

#[test]
fn a_tenants_rebuild_cuts_its_aliases_over_from_one_revision_to_the_next() {
    let actions = revision_cutover_actions("denorm", "acme", 1, (0, 1), &KINDS);
    let files = of_files(&actions);
    assert_eq!(
        files,
        [
            "remove denorm-files denorm-t-acme-files-000002",
            "remove denorm-t-acme-files denorm-t-acme-files-000002",
            "add denorm-files denorm-t-acme-files-000002-r1",
            "add denorm-t-acme-files denorm-t-acme-files-000002-r1",
            "add denorm-t-acme-files-g1 denorm-t-acme-files-000002-r1",
            "remove denorm-t-acme-files-g1-r1 denorm-t-acme-files-000002-r1",
        ]
    );
    assert_eq!(actions.len(), 18);
}

#[test]
fn a_tenant_moving_in_from_the_shared_indexes_is_fenced_then_cut_over_and_hidden_there() {
    let shared = Placement::new(["acme"]);
    let fenced = shared.entering("globex", 1);
    // Fenced: its live writes go through its own write alias (on no
    // index until the cutover), routed as its own.
    assert_eq!(fenced.write_target("denorm", Kind::File, 0, Some("globex")), "denorm-t-globex-files-g0");
    assert!(fenced.is_entering("globex") && fenced.is_dedicated(Some("globex")));
    assert_eq!((shared.moves(), fenced.moves()), (0, 1));
    assert_eq!(Placement::from_json(&fenced.to_json()).unwrap(), fenced);
    assert_eq!(Placement::from_json(&json!({"dedicated": ["acme"]})).unwrap(), shared, "recorded before moves");
    // Its rebuild's writers refresh what they write, before it is
    // dedicated as well as after.
    for placed in [&shared, &fenced] {
        let aliases = placed.building("globex", 1).write_aliases("denorm", 0, &KINDS);
        assert!(aliases.contains(&"denorm-t-globex-files-g0-r1".to_string()), "{aliases:?}");
        assert_eq!(aliases.len(), 9, "{aliases:?}");
    }
    // Searched in the shared indexes until its cutover.
    assert_eq!(fenced.searched("denorm", Kind::File, 0), vec!["denorm-files-000001", "denorm-t-acme-files-000001"]);
    assert_eq!(fenced.shared_read_alias(), crate::index::elastic::mapping::read_alias());
    assert_eq!(fenced.hidden_by_name("denorm", Kind::File, 0), None);
    // The shared read alias hides it once it is cut over, and so does a
    // search that names the shared index.
    let moved = fenced.entered("globex");
    assert_eq!(moved.searched("denorm", Kind::File, 0), moved.indexes("denorm", Kind::File, 0));
    assert_eq!(moved.searched("denorm", Kind::File, 0)[2], "denorm-t-globex-files-000001-r1");
    assert_eq!(moved.hidden_by_name("denorm", Kind::Post, 0).unwrap()["bool"]["filter"][1], json!({"term": {"_index": "denorm-posts-000001"}}));
    assert!(!moved.is_entering("globex") && moved.is_dedicated(Some("globex")));
    assert_eq!(moved.shared_read_alias()["filter"]["bool"]["must_not"][1], json!({"terms": {"tenant": ["globex"]}}));
    assert_eq!(shared.shared_read_alias(), crate::index::elastic::mapping::read_alias());
    // Its documents in the shared indexes deleted: nothing left to hide.
    assert_eq!(moved.unhidden("globex").shared_read_alias(), crate::index::elastic::mapping::read_alias());
    assert!(moved.unhidden("globex").is_dedicated(Some("globex")));
    // Given up: as before, the move counted.
    let back = fenced.not_entering("globex", 0);
    assert!(back.same_tenants(&shared) && back.revision("globex") == 0 && back.moves() == 2);
    assert_eq!(back.shared_read_alias(), crate::index::elastic::mapping::read_alias());

    let actions = entering_cutover_actions("denorm", "globex", 0, 1, (&moved.shared_read_alias(), &["denorm-t-globex-files".into()]), &KINDS);
    let files = of_files(&actions);
    assert_eq!(
        files,
        [
            "remove denorm-t-globex-files denorm-files-000001",
            "add denorm-files denorm-files-000001",
            "add denorm-files denorm-t-globex-files-000001-r1",
            "add denorm-t-globex-files denorm-t-globex-files-000001-r1",
            "add denorm-t-globex-files-g0 denorm-t-globex-files-000001-r1",
            "remove denorm-t-globex-files-g0-r1 denorm-t-globex-files-000001-r1",
        ]
    );
    assert_eq!(actions[1]["add"]["is_write_index"], json!(true), "the shared index stays the write index");
    assert_eq!(actions.len(), 6 + 5 + 5, "the tenant's filtered alias is on the shared files index only");
}

#[test]
fn a_tenant_leaving_its_own_indexes_is_rebuilt_into_the_shared_ones_hidden_until_its_cutover() {
    let own = Placement::new(["acme"]);
    let leaving = own.leaving("acme");
    // Its rebuild writes the shared indexes, through an alias routed by
    // the tenant (not named as a tenant's own); the live writers still
    // write its own.
    let alias = leaving.building("acme", 1).write_target("denorm", Kind::File, 0, Some("acme"));
    assert_eq!(alias, "denorm-files-g0-r1-for-acme");
    assert_eq!(super::super::names::routing(&alias, "acme\u{1f}f1"), Some("acme"));
    assert_eq!(leaving.write_target("denorm", Kind::File, 0, Some("acme")), "denorm-t-acme-files-g0");
    // Hidden in the shared indexes, searched in its own.
    assert_eq!(leaving.searched("denorm", Kind::File, 0), own.searched("denorm", Kind::File, 0));
    assert!(leaving.hidden_by_name("denorm", Kind::File, 0).is_some());
    assert_eq!(Placement::from_json(&leaving.to_json()).unwrap(), leaving);
    // Cut over: shared, shown again, a move counted.
    let left = leaving.left("acme", 1);
    assert!(!left.is_dedicated(Some("acme")) && !left.is_leaving("acme") && left.moves() == 1 && left.revision("acme") == 1);
    assert_eq!(left.shared_read_alias(), crate::index::elastic::mapping::read_alias());
    assert_eq!(leaving.not_leaving("acme"), own);
    let files = of_files(&leaving_cutover_actions("denorm", "acme", 0, (0, 1), &left.shared_read_alias(), &KINDS));
    assert_eq!(
        files,
        [
            "remove denorm-files denorm-t-acme-files-000001",
            "remove denorm-t-acme-files denorm-t-acme-files-000001",
            "add denorm-files denorm-files-000001",
            "add denorm-t-acme-files denorm-files-000001",
            "remove denorm-files-g0-r1-for-acme denorm-files-000001",
        ]
    );
}

#[test]
fn a_configuration_that_differs_from_the_generation_is_named() {
    assert_eq!(differs(&Placement::new(["acme"]), &Placement::new(["acme"]), 0), None);
    let line = differs(&Placement::new(["acme"]), &Placement::default(), 3).unwrap();
    assert!(line.contains("names acme, but generation 3 gives indexes of their own to none"), "{line}");
}
