"""What berth's tests do to a real MLflow server, with MLflow's own client
(in .venv-mlflow, beside tests/mlflow/serve.py). The server is
MLFLOW_TRACKING_URI. Each command prints one JSON line.

    registry.py version NAME DIR           log DIR's files as a run's model
                                           (an MLmodel file among them) and
                                           register a new version of NAME
    registry.py alias NAME ALIAS VERSION   point ALIAS of NAME at VERSION
    registry.py webhook URL SECRET         a webhook (MLflow's own API) for
                                           model_version.created and
                                           model_version_alias.created
"""

import json
import sys

import mlflow
from mlflow import MlflowClient


def version(name, folder):
    with mlflow.start_run() as run:
        mlflow.log_artifacts(folder, artifact_path="model")
    registered = mlflow.register_model(f"runs:/{run.info.run_id}/model", name)
    return {
        "version": registered.version,
        "run_id": run.info.run_id,
        "experiment_id": run.info.experiment_id,
    }


def alias(name, alias, version):
    MlflowClient().set_registered_model_alias(name, alias, version)
    return {}


def webhook(url, secret):
    hook = MlflowClient().create_webhook(
        name="berth",
        url=url,
        events=["model_version.created", "model_version_alias.created"],
        secret=secret,
    )
    return {"webhook_id": hook.webhook_id}


COMMANDS = {"version": version, "alias": alias, "webhook": webhook}

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])), flush=True)
