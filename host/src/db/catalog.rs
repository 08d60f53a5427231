//! The deployers stored over the API: plugin bytes by sha256, the versions
//! of each name, and the version each name serves. Knows names, digests
//! and texts, never what a plugin is (`catalog` loads them).

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{Db, Result, now};

/// One version of a deployer stored over the API, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredVersion {
    pub id: i64,
    pub name: String,
    /// Its place among the name's versions: 1, 2, …
    pub number: i64,
    pub sha256: String,
    /// Of the `.wasm`, in bytes.
    pub size: i64,
    /// The manifest's TOML text, as uploaded.
    pub manifest: Option<String>,
    /// The detached signature's text, as uploaded.
    pub signature: Option<String>,
    /// Where its bytes were pulled from: a registry's manifest pinned by
    /// digest (`oci://REG/REPO@sha256:…`); none for an upload.
    pub source: Option<String>,
    /// The API token that added it (none without tokens).
    pub added_by: Option<String>,
    pub added_at: String,
    /// While held for an admin's approval: what it grants beyond the
    /// version it would replace.
    pub held: Option<Vec<String>>,
}

/// What storing a version did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// The name is new.
    Added,
    /// The name served another version before.
    Replaced,
    /// The name already serves these very bytes, manifest, signature and
    /// source.
    Unchanged,
    /// Stored, not served: it asks for more than the version it would
    /// replace, and waits for an admin's approval.
    Held,
}

const VERSION_COLUMNS: &str = "v.id, v.name, v.sha256, b.size, v.manifest, v.signature, \
     v.source, v.added_by, v.added_at, v.held, (SELECT COUNT(*) FROM deployer_versions w \
     WHERE w.name = v.name AND w.id <= v.id) AS number";

/// A new version, as `store_version` takes it.
pub struct NewVersion {
    pub name: String,
    pub wasm: bytes::Bytes,
    pub sha256: String,
    pub manifest: Option<String>,
    pub signature: Option<String>,
    pub source: Option<String>,
    pub added_by: Option<String>,
    /// What it grants beyond the version it replaces: stored, not served,
    /// until approved.
    pub held: Vec<String>,
}

impl Db {
    /// Approves the held version `version_id` of `name`: it is held no
    /// more (serving it is `serve_version`'s). False if it was not held.
    pub async fn release_held(&self, name: &str, version_id: i64) -> Result<bool> {
        let name = name.to_string();
        self.write(statements!(|conn| {
            let released = sqlx::query(
                "UPDATE deployer_versions SET held = NULL \
                 WHERE name = $1 AND id = $2 AND held IS NOT NULL",
            )
            .bind(name)
            .bind(version_id)
            .execute(conn)
            .await?;
            Ok(released.rows_affected() == 1)
        }))
        .await
    }

    /// Makes `new` the version its name serves, keeping the ones before it;
    /// the bytes are stored once per sha256. Storing what the name already
    /// serves changes nothing; a version `held` is stored, not served.
    pub async fn store_version(&self, new: NewVersion) -> Result<(StoredVersion, Pushed)> {
        self.write(move |conn| Box::pin(store_version(conn, new)))
            .await
    }

    /// The version each stored deployer serves, by name.
    pub async fn stored_deployers(&self) -> Result<Vec<StoredVersion>> {
        let rows = sqlx::query(&format!(
            "SELECT {VERSION_COLUMNS} FROM stored_deployers s \
             JOIN deployer_versions v ON v.id = s.version_id \
             JOIN plugin_blobs b ON b.sha256 = v.sha256 ORDER BY v.name"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(version_row).collect()
    }

    /// Every version of a stored deployer, oldest first, and the id of the
    /// one it serves (none: no such stored deployer).
    pub async fn deployer_versions(&self, name: &str) -> Result<(Vec<StoredVersion>, Option<i64>)> {
        let rows = sqlx::query(&format!(
            "SELECT {VERSION_COLUMNS} FROM deployer_versions v \
             JOIN plugin_blobs b ON b.sha256 = v.sha256 WHERE v.name = $1 ORDER BY v.id"
        ))
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        let versions = rows.iter().map(version_row).collect::<Result<_>>()?;
        let current = sqlx::query("SELECT version_id FROM stored_deployers WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .map(|row| row.try_get("version_id"))
            .transpose()?;
        Ok((versions, current))
    }

    /// The bytes of a stored plugin.
    pub async fn plugin_wasm(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        let row = sqlx::query("SELECT wasm FROM plugin_blobs WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| row.try_get("wasm")).transpose()?)
    }

    /// Makes a stored deployer serve one of its versions again. False if
    /// the name is not stored (removed meanwhile).
    pub async fn serve_version(&self, name: &str, version_id: i64) -> Result<bool> {
        let name = name.to_string();
        self.write(statements!(|conn| {
            let updated = sqlx::query(
                "UPDATE stored_deployers SET version_id = $1 WHERE name = $2 \
                 AND EXISTS (SELECT 1 FROM deployer_versions WHERE id = $1 AND name = $2)",
            )
            .bind(version_id)
            .bind(&name)
            .execute(conn)
            .await?;
            Ok(updated.rows_affected() > 0)
        }))
        .await
    }

    /// Removes a stored deployer with all its versions, and the bytes no
    /// other version uses. False if there was no such stored deployer.
    pub async fn remove_stored(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(statements!(|conn| {
            let removed = sqlx::query("DELETE FROM stored_deployers WHERE name = $1")
                .bind(&name)
                .execute(&mut *conn)
                .await?;
            sqlx::query("DELETE FROM deployer_versions WHERE name = $1")
                .bind(&name)
                .execute(&mut *conn)
                .await?;
            sqlx::query(
                "DELETE FROM plugin_blobs WHERE sha256 NOT IN \
                 (SELECT sha256 FROM deployer_versions)",
            )
            .execute(&mut *conn)
            .await?;
            Ok(removed.rows_affected() > 0)
        }))
        .await
    }
}

/// The statements of `Db::store_version`.
async fn store_version(
    conn: &mut AnyConnection,
    new: NewVersion,
) -> Result<(StoredVersion, Pushed)> {
    let current = sqlx::query(&format!(
        "SELECT {VERSION_COLUMNS} FROM stored_deployers s \
         JOIN deployer_versions v ON v.id = s.version_id \
         JOIN plugin_blobs b ON b.sha256 = v.sha256 WHERE s.name = $1"
    ))
    .bind(&new.name)
    .fetch_optional(&mut *conn)
    .await?
    .map(|row| version_row(&row))
    .transpose()?;
    if let Some(current) = &current
        && current.sha256 == new.sha256
        && current.manifest == new.manifest
        && current.signature == new.signature
        && current.source == new.source
    {
        return Ok((current.clone(), Pushed::Unchanged));
    }
    // Bytes already stored (another version, another name) are not sent again.
    let stored = sqlx::query("SELECT 1 FROM plugin_blobs WHERE sha256 = $1")
        .bind(&new.sha256)
        .fetch_optional(&mut *conn)
        .await?
        .is_some();
    if !stored {
        let size = i64::try_from(new.wasm.len()).unwrap_or(i64::MAX);
        sqlx::query("INSERT INTO plugin_blobs (sha256, wasm, size) VALUES ($1, $2, $3)")
            .bind(&new.sha256)
            .bind(&new.wasm[..])
            .bind(size)
            .execute(&mut *conn)
            .await?;
    }
    let held = match new.held.is_empty() {
        true => None,
        false => Some(
            serde_json::to_string(&new.held).map_err(|e| super::Error::Corrupt(e.to_string()))?,
        ),
    };
    let id: i64 = sqlx::query(
        "INSERT INTO deployer_versions \
         (name, sha256, manifest, signature, source, added_by, added_at, held) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .bind(&new.name)
    .bind(&new.sha256)
    .bind(&new.manifest)
    .bind(&new.signature)
    .bind(&new.source)
    .bind(&new.added_by)
    .bind(now())
    .bind(held.clone())
    .fetch_one(&mut *conn)
    .await?
    .try_get("id")?;
    if held.is_some() {
        let row = sqlx::query(&format!(
            "SELECT {VERSION_COLUMNS} FROM deployer_versions v \
             JOIN plugin_blobs b ON b.sha256 = v.sha256 WHERE v.id = $1"
        ))
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
        return Ok((version_row(&row)?, Pushed::Held));
    }
    sqlx::query(
        "INSERT INTO stored_deployers (name, version_id) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET version_id = excluded.version_id",
    )
    .bind(&new.name)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    let row = sqlx::query(&format!(
        "SELECT {VERSION_COLUMNS} FROM deployer_versions v \
         JOIN plugin_blobs b ON b.sha256 = v.sha256 WHERE v.id = $1"
    ))
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let pushed = match current {
        Some(_) => Pushed::Replaced,
        None => Pushed::Added,
    };
    Ok((version_row(&row)?, pushed))
}

fn version_row(row: &AnyRow) -> Result<StoredVersion> {
    Ok(StoredVersion {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        number: row.try_get("number")?,
        sha256: row.try_get("sha256")?,
        size: row.try_get("size")?,
        manifest: row.try_get("manifest")?,
        signature: row.try_get("signature")?,
        source: row.try_get("source")?,
        added_by: row.try_get("added_by")?,
        added_at: row.try_get("added_at")?,
        held: row
            .try_get::<Option<String>, _>("held")?
            .map(|text| {
                serde_json::from_str(&text)
                    .map_err(|e| super::Error::Corrupt(format!("held = {text:?}: {e}")))
            })
            .transpose()?,
    })
}
