//! The schema's migrations, compiled in, and applying them at connect.
//! Never edits a migration: a change to the schema is a new file in both
//! `migrations/sqlite/` and `migrations/postgres/`, under the same number
//! and name, and a line in each list below.

use sqlx::AnyPool;
use sqlx::migrate::MigrateError;

use super::{Backend, Error, Result};

/// The schema's migrations, compiled in: (version, description, SQL) per
/// backend, one entry per file of `migrations/<backend>/`. Listed by hand
/// rather than by `sqlx::migrate!`, whose macro compiles both database
/// drivers a second time; a test keeps the list and the folders in step.
const SQLITE_MIGRATIONS: Migrations = Migrations(&[
    (
        1,
        "initial",
        include_str!("../../../migrations/sqlite/0001_initial.sql"),
    ),
    (
        2,
        "live deployments",
        include_str!("../../../migrations/sqlite/0002_live_deployments.sql"),
    ),
    (
        3,
        "created by",
        include_str!("../../../migrations/sqlite/0003_created_by.sql"),
    ),
    (
        4,
        "queue",
        include_str!("../../../migrations/sqlite/0004_queue.sql"),
    ),
    (
        5,
        "events",
        include_str!("../../../migrations/sqlite/0005_events.sql"),
    ),
    (
        6,
        "catalog",
        include_str!("../../../migrations/sqlite/0006_catalog.sql"),
    ),
    (
        7,
        "published",
        include_str!("../../../migrations/sqlite/0007_published.sql"),
    ),
    (
        8,
        "deployer source",
        include_str!("../../../migrations/sqlite/0008_deployer_source.sql"),
    ),
    (
        9,
        "approvals",
        include_str!("../../../migrations/sqlite/0009_approvals.sql"),
    ),
    (
        10,
        "rules",
        include_str!("../../../migrations/sqlite/0010_rules.sql"),
    ),
    (
        11,
        "unknown training values",
        include_str!("../../../migrations/sqlite/0011_unknown_training_values.sql"),
    ),
    (
        12,
        "model signatures",
        include_str!("../../../migrations/sqlite/0012_model_signatures.sql"),
    ),
    (
        13,
        "file formats",
        include_str!("../../../migrations/sqlite/0013_file_formats.sql"),
    ),
]);
const POSTGRES_MIGRATIONS: Migrations = Migrations(&[
    (
        1,
        "initial",
        include_str!("../../../migrations/postgres/0001_initial.sql"),
    ),
    (
        2,
        "live deployments",
        include_str!("../../../migrations/postgres/0002_live_deployments.sql"),
    ),
    (
        3,
        "created by",
        include_str!("../../../migrations/postgres/0003_created_by.sql"),
    ),
    (
        4,
        "queue",
        include_str!("../../../migrations/postgres/0004_queue.sql"),
    ),
    (
        5,
        "events",
        include_str!("../../../migrations/postgres/0005_events.sql"),
    ),
    (
        6,
        "catalog",
        include_str!("../../../migrations/postgres/0006_catalog.sql"),
    ),
    (
        7,
        "published",
        include_str!("../../../migrations/postgres/0007_published.sql"),
    ),
    (
        8,
        "deployer source",
        include_str!("../../../migrations/postgres/0008_deployer_source.sql"),
    ),
    (
        9,
        "approvals",
        include_str!("../../../migrations/postgres/0009_approvals.sql"),
    ),
    (
        10,
        "rules",
        include_str!("../../../migrations/postgres/0010_rules.sql"),
    ),
    (
        11,
        "unknown training values",
        include_str!("../../../migrations/postgres/0011_unknown_training_values.sql"),
    ),
    (
        12,
        "model signatures",
        include_str!("../../../migrations/postgres/0012_model_signatures.sql"),
    ),
    (
        13,
        "file formats",
        include_str!("../../../migrations/postgres/0013_file_formats.sql"),
    ),
]);

#[derive(Debug, Clone, Copy)]
struct Migrations(&'static [(i64, &'static str, &'static str)]);

impl sqlx::migrate::MigrationSource<'static> for Migrations {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<
        'static,
        std::result::Result<Vec<sqlx::migrate::Migration>, sqlx::error::BoxDynError>,
    > {
        let migrations = self
            .0
            .iter()
            .map(|&(version, description, sql)| {
                sqlx::migrate::Migration::new(
                    version,
                    description.into(),
                    sqlx::migrate::MigrationType::Simple,
                    sql.into(),
                    false,
                )
            })
            .collect();
        Box::pin(std::future::ready(Ok(migrations)))
    }
}

/// Brings the database at `pool` up to the newest migration of `backend`.
pub(super) async fn apply(pool: &AnyPool, backend: Backend) -> Result<()> {
    let migrations = match backend {
        Backend::Sqlite => SQLITE_MIGRATIONS,
        Backend::Postgres => POSTGRES_MIGRATIONS,
    };
    let known = migrations.0.last().map_or(0, |&(version, _, _)| version);
    let migrator = sqlx::migrate::Migrator::new(migrations).await?;
    migrator.run(pool).await.map_err(|e| match e {
        // sqlx refuses an applied migration it was not given: one made by
        // a newer berth. Said as such, not as sqlx's "missing".
        MigrateError::VersionMissing(applied) => Error::SchemaNewer { applied, known },
        MigrateError::Execute(e) => e.into(),
        e => e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of `migrations/<backend>/` is compiled in, under the
    /// version and description sqlx gives a file of that name, so databases
    /// migrated before the list existed keep matching it.
    #[test]
    fn compiled_in_migrations_are_the_migration_files() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        for (backend, Migrations(listed)) in [
            ("sqlite", SQLITE_MIGRATIONS),
            ("postgres", POSTGRES_MIGRATIONS),
        ] {
            let mut files: Vec<_> = std::fs::read_dir(root.join(backend))
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .collect();
            files.sort();
            let on_disk: Vec<(i64, String, String)> = files
                .iter()
                .map(|path| {
                    let name = path.file_name().unwrap().to_str().unwrap();
                    let (version, rest) =
                        name.strip_suffix(".sql").unwrap().split_once('_').unwrap();
                    let sql = std::fs::read_to_string(path).unwrap();
                    (version.parse().unwrap(), rest.replace('_', " "), sql)
                })
                .collect();
            let compiled: Vec<(i64, String, String)> = listed
                .iter()
                .map(|&(v, d, sql)| (v, d.to_string(), sql.to_string()))
                .collect();
            assert_eq!(
                compiled, on_disk,
                "{backend}: the list in db/migrations.rs and the folder differ"
            );
        }
    }

    /// A model recorded before unknown training values were NULL comes
    /// out of the upgrade with its 0s and ""s unknown, the rest as it was.
    #[tokio::test]
    async fn zeros_and_blanks_recorded_before_become_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::db::testing::url(&dir);
        let pool = super::super::sqlite::pool(&super::super::sqlite::url(&url), 1)
            .await
            .unwrap();
        let before = Migrations(&SQLITE_MIGRATIONS.0[..10]);
        sqlx::migrate::Migrator::new(before)
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (job, base, steps) in [("old-unknown", "", 0), ("old-known", "llama", 750)] {
            sqlx::query(
                "INSERT INTO models (name, job_id, base_model, model_size, dataset, \
                 num_examples, num_train_steps, source, created_at) \
                 VALUES ($1, $1, $2, '', '', 0, $3, 'file:///m/{path}', '2026-12-01T00:00:00Z')",
            )
            .bind(job)
            .bind(base)
            .bind(steps)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
        let db = crate::db::Db::connect(&url).await.unwrap();
        let models = db.models().await.unwrap();
        let unknown = &models[0];
        assert_eq!(
            (
                &unknown.base_model,
                unknown.num_train_steps,
                unknown.num_examples
            ),
            (&None, None, None)
        );
        let known = &models[1];
        assert_eq!(
            (
                known.base_model.as_deref(),
                known.num_train_steps,
                &known.dataset
            ),
            (Some("llama"), Some(750), &None)
        );
    }

    /// A database migrated by a newer berth is refused at connect with
    /// berth's sentence, and nothing of it is touched.
    #[tokio::test]
    async fn a_database_with_a_newer_migration_is_refused_with_a_sentence() {
        let (dir, db) = crate::db::testing::open().await;
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (9999, 'from the future', TRUE, x'00', 0)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        db.close().await;
        let refused = match crate::db::Db::connect(&crate::db::testing::url(&dir)).await {
            Ok(_) => panic!("a newer schema was accepted"),
            Err(e) => e,
        };
        assert!(
            matches!(refused, Error::SchemaNewer { applied: 9999, .. }),
            "{refused:?}"
        );
        assert!(
            refused
                .to_string()
                .contains("migration 9999, newer than this build of berth knows"),
            "{refused}"
        );
    }
}
