//! Tenants and API keys.

use super::*;

conformance!(tenants_and_keys);

// --- scenarios ---------------------------------------------------------------

async fn tenants_and_keys(store: &Store) {
    let a = tenant(store, "acme").await;
    let b = tenant(store, "globex").await;
    assert_eq!(store.tenants().get(a.id).await.unwrap(), Some(a.clone()));
    assert_eq!(
        store.tenants().find_by_name("globex").await.unwrap(),
        Some(b.clone())
    );
    assert_eq!(store.tenants().find_by_name("nobody").await.unwrap(), None);
    assert_eq!(
        store.tenants().list().await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    // Names are unique: a typed conflict, not a database error.
    let dup = Tenant {
        id: TenantId::new(),
        ..a.clone()
    };
    assert!(matches!(
        store.tenants().insert(&dup).await,
        Err(Error::Conflict(_))
    ));

    assert!(
        store
            .tenants()
            .update_plan(a.id, Plan::Enterprise, Some(36))
            .await
            .unwrap()
    );
    assert!(
        !store
            .tenants()
            .update_plan(TenantId::new(), Plan::Free, None)
            .await
            .unwrap()
    );
    let a = store.tenants().get(a.id).await.unwrap().unwrap();
    assert_eq!((a.plan, a.retention_months), (Plan::Enterprise, Some(36)));

    let key = ApiKey {
        last_used_at: None,
        id: ApiKeyId::new(),
        tenant_id: a.id,
        prefix: "fk_live_abcd".into(),
        rate_limit_rps: Some(250),
        created_at: now(),
        revoked_at: None,
    };
    let hash = [7u8; 32];
    store.keys().insert(&key, &hash).await.unwrap();
    let found = store
        .keys()
        .lookup(&hash)
        .await
        .unwrap()
        .expect("key found by hash");
    assert_eq!(found.key, key);
    assert_eq!(found.tenant, a);
    assert!(store.keys().lookup(&[8u8; 32]).await.unwrap().is_none());
    assert_eq!(store.keys().list(a.id).await.unwrap(), vec![key.clone()]);
    assert!(store.keys().list(b.id).await.unwrap().is_empty());

    let at = now();
    assert!(store.keys().revoke(key.id, at).await.unwrap());
    assert!(!store.keys().revoke(ApiKeyId::new(), at).await.unwrap());
    let revoked = store.keys().lookup(&hash).await.unwrap().unwrap();
    assert_eq!(revoked.key.revoked_at, Some(at));
}
