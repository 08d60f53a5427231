//! The models and their files: registering, reading, deleting. A model's
//! deployments go with it (`ON DELETE CASCADE`); its files on disk are
//! never touched here.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::append;
use super::events::ModelReport;
use super::{Db, Error, Result, now};
use crate::model::{Format, ModelFile, Signature, TrainedModel};

/// When a model was last deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastDeployed {
    pub model_id: i64,
    pub job_id: String,
    /// The newest deployment's `created_at` (RFC 3339, UTC); none if the
    /// model was never deployed.
    pub last_deployed: Option<String>,
}

const MODEL_COLUMNS: &str = "id, name, job_id, base_model, model_size, dataset, num_examples, \
     num_train_steps, final_loss, params, source, created_at, created_by, signature, \
     signature_method, signature_signer, signature_verified_at, signature_error";

impl Db {
    /// Records a model and its files in one transaction; `id` and
    /// `created_at` of the argument are ignored.
    pub async fn insert_model(&self, model: &TrainedModel) -> Result<TrainedModel> {
        let mut model = model.clone();
        model.created_at = now();
        self.write(move |conn| Box::pin(insert_model(conn, model)))
            .await
    }

    /// Records a model as `insert_model` does, with the events `report`
    /// words from its row in the same transaction.
    pub async fn insert_model_reported(
        &self,
        model: &TrainedModel,
        report: ModelReport,
    ) -> Result<TrainedModel> {
        let mut model = model.clone();
        model.created_at = now();
        let backend = self.backend;
        let (row, last) = self
            .write(statements!(|conn| {
                let row = insert_model(&mut *conn, model).await?;
                let events = (report.events)(&row);
                let last = append::insert(conn, backend, &report.server_id, events).await?;
                Ok((row, last))
            }))
            .await?;
        self.appended(last);
        Ok(row)
    }

    pub async fn models(&self) -> Result<Vec<TrainedModel>> {
        let rows = sqlx::query(&format!("SELECT {MODEL_COLUMNS} FROM models ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        let mut models = rows.iter().map(model_row).collect::<Result<Vec<_>>>()?;
        let files = sqlx::query(
            "SELECT model_id, path, size_bytes, sha256, format FROM model_files \
             ORDER BY model_id, position",
        )
        .fetch_all(&self.pool)
        .await?;
        for row in &files {
            let model_id: i64 = row.try_get("model_id")?;
            if let Ok(at) = models.binary_search_by_key(&model_id, |m| m.id) {
                models[at].files.push(file_row(row)?);
            }
        }
        Ok(models)
    }

    /// A model with its files, read in one statement: the model's row
    /// first (position -1), then its files' rows in order: one round trip
    /// a deployment fewer than two reads.
    pub async fn model(&self, id: i64) -> Result<Option<TrainedModel>> {
        let nothing = vec!["NULL"; MODEL_COLUMNS.split(',').count()].join(", ");
        let rows = sqlx::query(&format!(
            "SELECT {MODEL_COLUMNS}, NULL AS path, NULL AS size_bytes, NULL AS sha256, \
             NULL AS format, -1 AS position FROM models WHERE id = $1 \
             UNION ALL SELECT {nothing}, path, size_bytes, sha256, format, position \
             FROM model_files WHERE model_id = $1 ORDER BY position"
        ))
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        // No model, no files (they go with it): nothing at all.
        let Some((first, files)) = rows.split_first() else {
            return Ok(None);
        };
        let mut model = model_row(first)?;
        model.files = files.iter().map(file_row).collect::<Result<_>>()?;
        Ok(Some(model))
    }

    /// The model registered under `job_id`, if any.
    pub async fn model_by_job_id(&self, job_id: &str) -> Result<Option<TrainedModel>> {
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM models WHERE job_id = $1")
            .bind(job_id)
            .fetch_optional(&self.pool)
            .await?;
        match id {
            Some(id) => self.model(id).await,
            None => Ok(None),
        }
    }

    /// Every model with the time its newest deployment was made (of any
    /// status), least recently deployed first: never-deployed models
    /// first, then by that time, then by id. The order copies are dropped
    /// in to keep the models dir within its budget.
    pub async fn models_by_last_deployed(&self) -> Result<Vec<LastDeployed>> {
        // A subquery per model, on the index by model: no GROUP BY whose
        // output PostgreSQL would refuse to order by an expression of. The
        // newest row's time, read from the end of that index, stands for the
        // latest time: one row a model, not every deployment it ever had.
        let rows = sqlx::query(
            "SELECT id, job_id, last_deployed FROM (\
               SELECT m.id, m.job_id, \
                 (SELECT d.created_at FROM deployments d WHERE d.model_id = m.id \
                  ORDER BY d.id DESC LIMIT 1) AS last_deployed \
               FROM models m) AS t \
             ORDER BY CASE WHEN last_deployed IS NULL THEN 0 ELSE 1 END, last_deployed, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(LastDeployed {
                    model_id: row.try_get("id")?,
                    job_id: row.try_get("job_id")?,
                    last_deployed: row.try_get("last_deployed")?,
                })
            })
            .collect()
    }

    /// Records what the files of model `model_id` are, as a fetch found
    /// them: one `(path, format)` per file. A file since deleted is
    /// skipped.
    pub async fn record_formats(
        &self,
        model_id: i64,
        formats: Vec<(String, Format)>,
    ) -> Result<()> {
        self.write(statements!(|conn| {
            for (path, format) in &formats {
                sqlx::query("UPDATE model_files SET format = $1 WHERE model_id = $2 AND path = $3")
                    .bind(format.as_str())
                    .bind(model_id)
                    .bind(path)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }))
        .await
    }

    /// Deletes a model with its files' records and its deployments. Returns
    /// false if there was no such model.
    pub async fn delete_model(&self, id: i64) -> Result<bool> {
        self.write(statements!(|conn| {
            let deleted = sqlx::query("DELETE FROM models WHERE id = $1")
                .bind(id)
                .execute(conn)
                .await?;
            Ok(deleted.rows_affected() > 0)
        }))
        .await
    }
}

/// The statements of `Db::insert_model`: the model as recorded, its id set.
async fn insert_model(conn: &mut AnyConnection, mut model: TrainedModel) -> Result<TrainedModel> {
    let insert = sqlx::query(
        "INSERT INTO models (name, job_id, base_model, model_size, dataset, num_examples, \
         num_train_steps, final_loss, params, source, created_at, created_by, signature, \
         signature_method, signature_signer, signature_verified_at, signature_error) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
         RETURNING id",
    )
    .bind(&model.name)
    .bind(&model.job_id)
    .bind(&model.base_model)
    .bind(&model.model_size)
    .bind(&model.dataset)
    .bind(model.num_examples.map(to_i64))
    .bind(model.num_train_steps.map(to_i64));
    // sqlx 0.8's Any driver sends a NULL f64 to PostgreSQL as a `real`
    // and a NULL f32 as a `double precision` (the two are swapped). The
    // connection caches the statement with the first parameter types it
    // saw, so a `real` NULL made every later loss on that connection
    // fail; a NULL f32 keeps the statement `double precision`.
    let insert = match model.final_loss {
        Some(loss) => insert.bind(loss),
        None => insert.bind(None::<f32>),
    };
    let inserted = insert
        .bind(&model.params_json)
        .bind(&model.source)
        .bind(&model.created_at)
        .bind(&model.created_by)
        .bind(model.signature.as_ref().map(|s| &s.bundle))
        .bind(model.signature.as_ref().and_then(|s| s.method.as_ref()))
        .bind(model.signature.as_ref().and_then(|s| s.signer.as_ref()))
        .bind(
            model
                .signature
                .as_ref()
                .and_then(|s| s.verified_at.as_ref()),
        )
        .bind(model.signature.as_ref().and_then(|s| s.error.as_ref()))
        .fetch_one(&mut *conn)
        .await;
    let id: i64 = match inserted {
        Ok(row) => row.try_get(0)?,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            return Err(Error::DuplicateJob(model.job_id));
        }
        Err(e) => return Err(e.into()),
    };
    for (position, file) in model.files.iter().enumerate() {
        sqlx::query(
            "INSERT INTO model_files (model_id, position, path, size_bytes, sha256) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id)
        .bind(position as i64)
        .bind(&file.path)
        .bind(to_i64(file.size_bytes))
        .bind(&file.sha256)
        .execute(&mut *conn)
        .await?;
    }
    model.id = id;
    Ok(model)
}

/// Sizes and counts are u64 in the domain and BIGINT in both databases;
/// validation keeps them below 2^63.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn to_u64(value: i64, column: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("{column} = {value}")))
}

fn model_row(row: &AnyRow) -> Result<TrainedModel> {
    Ok(TrainedModel {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        job_id: row.try_get("job_id")?,
        base_model: row.try_get("base_model")?,
        model_size: row.try_get("model_size")?,
        dataset: row.try_get("dataset")?,
        num_examples: row
            .try_get::<Option<i64>, _>("num_examples")?
            .map(|n| to_u64(n, "num_examples"))
            .transpose()?,
        num_train_steps: row
            .try_get::<Option<i64>, _>("num_train_steps")?
            .map(|n| to_u64(n, "num_train_steps"))
            .transpose()?,
        final_loss: row.try_get("final_loss")?,
        params_json: row.try_get("params")?,
        source: row.try_get("source")?,
        files: Vec::new(),
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
        signature: row
            .try_get::<Option<String>, _>("signature")?
            .map(|bundle| -> Result<Signature> {
                Ok(Signature {
                    method: row.try_get("signature_method")?,
                    signer: row.try_get("signature_signer")?,
                    verified_at: row.try_get("signature_verified_at")?,
                    error: row.try_get("signature_error")?,
                    bundle,
                })
            })
            .transpose()?,
    })
}

fn file_row(row: &AnyRow) -> Result<ModelFile> {
    Ok(ModelFile {
        path: row.try_get("path")?,
        size_bytes: to_u64(row.try_get("size_bytes")?, "size_bytes")?,
        sha256: row.try_get("sha256")?,
        // A value this build does not know reads as unknown.
        format: row
            .try_get::<Option<String>, _>("format")?
            .as_deref()
            .and_then(Format::parse),
    })
}
