"""The admin page in a real browser: Debian's chromium driven by Playwright.

Run by the e2e test `page::the_page_works_in_a_real_browser` (tests/e2e/page.rs),
which starts `berth serve` with the `archive` and `misbehave` deployers and a
registered model, and gives this script:

  BERTH_URL, BERTH_MODEL_ID, BERTH_PLUGINS_DIR, BERTH_SCREENSHOTS

and, for a server that needs a token, BERTH_TOKEN: then only the token
scenario runs (`page::the_page_asks_for_a_token`).

To restart the server it prints `restart` and waits for a line on stdin.
Each scenario is bounded by Playwright's timeouts (hang guards, not timing
assertions); a failing one leaves a screenshot of every view it saw in
BERTH_SCREENSHOTS (BERTH_KEEP_SCREENSHOTS=1 keeps those of passing ones). Exit status 0 only if every scenario passed.
"""

import json
import os
import sys
import traceback
import urllib.request
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

URL = os.environ["BERTH_URL"]
MODEL_ID = int(os.environ["BERTH_MODEL_ID"])
PLUGINS = Path(os.environ["BERTH_PLUGINS_DIR"])
SHOTS = Path(os.environ["BERTH_SCREENSHOTS"])
TOKEN = os.environ.get("BERTH_TOKEN")
WAIT_MS = 30_000

expect.set_options(timeout=WAIT_MS)


def api(path):
    headers = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
    request = urllib.request.Request(URL + path, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def model_name():
    return api(f"/v1/models/{MODEL_ID}")["name"]


def open_model(page):
    page.goto(f"{URL}/#/models/{MODEL_ID}")
    expect(page.locator("#deployments")).to_be_visible()


def open_dialog(page):
    page.get_by_role("button", name=f"Deploy {model_name()}").click()
    dialog = page.locator("#deploy-dialog")
    expect(dialog).to_be_visible()
    return dialog


def watch_rows(page):
    """Records every status a deployment row is drawn with."""
    page.evaluate(
        """() => {
        window.seenStatuses = [];
        const record = (node) => {
          if (node.nodeType === 1 && node.matches('tr[data-deployment]'))
            window.seenStatuses.push(node.dataset.deployment + ':' + node.dataset.status);
        };
        new MutationObserver((mutations) => mutations.forEach((m) => m.addedNodes.forEach(record)))
          .observe(document.body, { childList: true, subtree: true });
      }"""
    )


def newest_row(page):
    return page.locator("#deployments-body tr").first


def deploy_with(page, deployer, options_json=None):
    dialog = open_dialog(page)
    section = dialog.locator(f'section[data-deployer="{deployer}"]')
    if options_json is not None:
        section.locator("textarea").fill(options_json)
    section.get_by_role("button", name=f"Deploy with {deployer}").click()
    return dialog, section


def scenario_schema_form_and_archive(page, shots):
    open_model(page)
    shots("model")
    watch_rows(page)
    dialog = open_dialog(page)
    shots("dialog")
    section = dialog.locator('section[data-deployer="archive"]')
    level = section.get_by_label("level")
    expect(level).to_have_attribute("type", "number")
    expect(level).to_have_value("6")
    expect(level).to_have_attribute("max", "9")
    expect(section.get_by_text("gzip compression level")).to_be_visible()
    # Out of the schema's range: refused in the dialog, nothing sent.
    level.fill("12")
    section.get_by_role("button", name="Deploy with archive").click()
    expect(section.locator(".problem").first).to_contain_text("level must be at most 9")
    expect(dialog).to_be_visible()
    level.fill("9")
    section.get_by_role("button", name="Deploy with archive").click()
    expect(dialog).to_be_hidden()
    row = newest_row(page)
    expect(row).to_have_attribute("data-status", "completed")
    deployment_id = int(row.get_attribute("data-deployment"))
    seen = page.evaluate("window.seenStatuses")
    assert f"{deployment_id}:running" in seen, f"the row was never drawn running: {seen}"
    stored = api(f"/v1/deployments/{deployment_id}")
    assert stored["options"] == {"level": 9}, stored
    expect(row.locator(".duration-cell")).not_to_be_empty()
    link = row.locator(".ref-cell a")
    expect(link).to_have_text(stored["ref"])
    with page.expect_download() as download:
        link.click()
    got = Path(download.value.path()).read_bytes()
    name = stored["ref"].removeprefix("/out/")
    want = (Path(stored["out_dir"]) / name).read_bytes()
    assert got == want, f"downloaded {len(got)} bytes, the out-dir file has {len(want)}"
    # Its details: options, details JSON, logs, the artifact.
    row.get_by_role("link", name=f"#{deployment_id}").click()
    expect(page.locator("#artifacts")).to_contain_text(name)
    expect(page.locator("#details")).to_contain_text('"sha256"')
    expect(page.locator("#logs")).to_contain_text("wrote /out/")
    shots("deployment")
    # The deployed model's copy is local, and the models view says what
    # the models dir holds.
    open_model(page)
    expect(page.locator("#model-storage")).to_have_attribute("data-local", "true")
    expect(page.locator("#model-storage")).to_contain_text("yes: deploys without fetching")
    page.goto(f"{URL}/#/")
    expect(page.locator("#storage-line")).to_contain_text("saved by sharing")


def scenario_failing_deployer(page, shots):
    open_model(page)
    deploy_with(page, "misbehave", '{"mode": "error"}')
    row = newest_row(page)
    expect(row).to_have_attribute("data-status", "failed")
    expect(row.locator(".error-cell")).to_contain_text("the deployer said no")
    shots("model-failed")


def scenario_bad_options(page, shots):
    open_model(page)
    rows = page.locator("#deployments-body tr").count()
    dialog, section = deploy_with(page, "misbehave", "[1, 2]")
    problem = section.locator(".problem")
    expect(problem).to_have_text("options must be a JSON object, not an array")
    section.locator("textarea").fill("{mode")
    section.get_by_role("button", name="Deploy with misbehave").click()
    expect(problem).to_contain_text("options are not JSON")
    # The server's own 400, next to what caused it.
    section.locator("textarea").fill('{"mode": "nope"}')
    section.get_by_role("button", name="Deploy with misbehave").click()
    expect(problem).to_contain_text('unknown mode "nope"')
    shots("dialog-refused")
    expect(dialog).to_be_visible()
    assert page.locator("#deployments-body tr").count() == rows
    # Keyboard: focus stays in the dialog, Esc closes it.
    for press in range(25):
        page.keyboard.press("Tab")
        inside = page.evaluate("document.getElementById('deploy-dialog').contains(document.activeElement)")
        focused = page.evaluate("document.activeElement.outerHTML.slice(0, 80)")
        assert inside, f"Tab {press + 1} left the open dialog for {focused}"
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    deploy = page.get_by_role("button", name=f"Deploy {model_name()}")
    deploy.focus()
    page.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()


def scenario_slow_then_cancel(page, shots):
    open_model(page)
    deploy_with(page, "misbehave", '{"mode": "sleep", "ms": 120000}')
    row = newest_row(page)
    expect(row).to_have_attribute("data-status", "running")
    expect(row.locator(".phase")).to_have_text("deploying")
    expect(row.locator("progress")).to_be_visible()
    shots("model-running")
    row.get_by_role("button", name="Cancel").click()
    row = newest_row(page)
    expect(row).to_have_attribute("data-status", "failed")
    expect(row.locator(".error-cell")).to_contain_text("cancelled")
    expect(row.get_by_role("button", name="Cancel")).to_have_count(0)


def scenario_register_with_three_mistakes(page, shots):
    page.goto(f"{URL}/#/")
    expect(page.locator("#models")).to_be_visible()
    page.locator("#register summary").click()
    page.get_by_label("Name", exact=True).fill("")
    page.get_by_label("Job id").fill("../escape")
    page.get_by_label("Source URL template").fill("ftp://example.invalid/{job_id}/{path}")
    page.get_by_role("button", name="Register").click()
    expect(page.locator("#reg-name-problem")).to_contain_text("name is required")
    expect(page.locator("#reg-job_id-problem")).to_contain_text("cannot be used as a directory name")
    expect(page.locator("#reg-source-problem")).to_contain_text("scheme ftp is not supported")
    shots("register-refused")


def scenario_corrupt_plugin(page, shots):
    page.goto(f"{URL}/#/")
    expect(page.locator("#deployers")).to_contain_text("archive")
    (PLUGINS / "corrupt.wasm").write_bytes(b"\0asm this is not a component")
    expect(page.locator('#refused tr[data-rejected="corrupt.wasm"]')).to_be_visible()
    shots("models-refused")


def scenario_pushed_deployer(page, shots):
    page.goto(f"{URL}/#/")
    expect(page.locator('#deployers article[data-deployer="archive"] .origin')).to_have_text("plugins folder")
    expect(page.locator('#deployers article[data-deployer="archive"] .targets')).to_have_text("none")
    wasm = (PLUGINS / "archive.wasm").read_bytes()
    # With a manifest granting a target this server does not configure.
    boundary = "berth-page-test-boundary"
    body = b""
    for name, data in [("wasm", wasm), ("manifest", b'targets = ["releases"]\n')]:
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n\r\n'.encode()
        body += data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if TOKEN:
        headers["Authorization"] = f"Bearer {TOKEN}"
    request = urllib.request.Request(URL + "/v1/deployers/packer", data=body, headers=headers, method="PUT")
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 201, answer.status
    # The page hears plugin.loaded and shows where the deployer comes from.
    origin = page.locator('#deployers article[data-deployer="packer"] .origin')
    expect(origin).to_contain_text("stored over the API: version 1, pushed")
    targets = page.locator('#deployers article[data-deployer="packer"] .targets')
    expect(targets).to_have_text("releases (not configured on this server)")
    shots("models-pushed-deployer")
    # The same bytes granting one more host: held, the card says what it
    # adds, and Approve serves it.
    body = b""
    for name, data in [("wasm", wasm), ("manifest", b'targets = ["releases"]\nallowed_hosts = ["models.example.com"]\n')]:
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n\r\n'.encode()
        body += data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    request = urllib.request.Request(URL + "/v1/deployers/packer", data=body, headers=headers, method="PUT")
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 202, answer.status
    page.reload()
    held = page.locator('#deployers article[data-deployer="packer"] .held')
    expect(held).to_contain_text("Version 2 is held: it adds allowed host models.example.com")
    held.get_by_role("button", name="Approve version 2").click()
    expect(origin).to_contain_text("stored over the API: version 2, pushed")
    expect(held).to_have_count(0)
    # Deployed with it, the deployment page names the plugin version it ran.
    open_model(page)
    deploy_with(page, "packer")
    row = newest_row(page)
    expect(row).to_have_attribute("data-status", "completed")
    row.locator("a").first.click()
    expect(page.locator("#deployment-fields")).to_contain_text(api("/v1/deployers/packer/versions")["versions"][0]["sha256"])
    headers.pop("Content-Type")
    request = urllib.request.Request(URL + "/v1/deployers/packer", headers=headers, method="DELETE")
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 204, answer.status


def send(method, path, body=None):
    headers = {"Content-Type": "application/json"}
    if TOKEN:
        headers["Authorization"] = f"Bearer {TOKEN}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(URL + path, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status


def scenario_approval(page, shots):
    # A rule holds a step after every archive deployment for approval.
    rule = {
        "name": "held-after-archive",
        "when": {"event": "deployment_completed", "deployer": "archive"},
        "deploy": {"deployer": "misbehave", "options": {"mode": "ok", "after": "${previous.ref}"}},
        "require_approval": True,
    }
    assert send("POST", "/v1/rules", rule) == 201
    open_model(page)
    deploy_with(page, "archive")
    # The model's chain shows the held step as soon as the rule fires.
    held = page.locator('#deployments-body tr[data-status="awaiting_approval"]')
    expect(held).to_have_count(1)
    expect(held.locator(".cause-cell")).to_contain_text("rule held-after-archive, after #")
    held_id = held.get_attribute("data-deployment")
    shots("model-held")
    approvals = page.context.new_page()
    approvals.goto(f"{URL}/#/approvals")
    row = approvals.locator(f'#pending tr[data-deployment="{held_id}"]')
    expect(row).to_contain_text("held-after-archive")
    expect(approvals.locator('#rules-table tr[data-rule="held-after-archive"]')).to_contain_text("required")
    row.get_by_role("textbox").fill("looks right")
    row.get_by_role("button", name="Approve").click()
    expect(approvals.locator("#no-approvals")).to_be_visible()
    # The model's page, in the other tab, follows live: queued, run, completed.
    done = page.locator(f'#deployments-body tr[data-deployment="{held_id}"]')
    expect(done).to_have_attribute("data-status", "completed")
    approvals.close()
    assert api(f"/v1/deployments/{held_id}")["approval"]["comment"] == "looks right"
    assert send("DELETE", "/v1/rules/held-after-archive") == 204


def scenario_reconnects_after_restart(page, shots):
    page.goto(f"{URL}/#/")
    badge = page.locator("#stream")
    expect(badge).to_have_text("live")
    print("restart", flush=True)
    assert sys.stdin.readline().strip() == "ok", "the test did not restart the server"
    expect(badge).to_have_text("live")
    # Live again: a change made now arrives without a reload.
    (PLUGINS / "corrupt-after-restart.wasm").write_bytes(b"not wasm at all")
    expect(page.locator('#refused tr[data-rejected="corrupt-after-restart.wasm"]')).to_be_visible()


def scenario_no_deployers(page, shots):
    page.goto(f"{URL}/#/")
    expect(page.locator("#deployers")).to_contain_text("misbehave")
    for name in ("archive.wasm", "misbehave.wasm"):
        (PLUGINS / name).unlink()
    expect(page.locator("#no-deployers")).to_be_visible()
    expect(page.get_by_role("button", name=f"Deploy {model_name()}")).to_be_disabled()
    shots("models-no-deployers")


def scenario_narrow_and_dark(page, shots):
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 900})
            for view in ("#/", f"#/models/{MODEL_ID}"):
                page.goto(f"{URL}/{view}")
                expect(page.locator("h1")).to_be_visible()
                # Drawn, newest deployments included (the event stream never
                # lets the network go idle).
                expect(page.locator("#main .muted", has_text="…")).to_have_count(0)
                overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"{view} at {width}px ({scheme}) is {overflow}px wider than the window"
                shots(f"{'models' if view == '#/' else 'model'}-{width}-{scheme}")


def scenario_token(page, shots):
    page.goto(f"{URL}/")
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("needs an API token")
    shots("token-asked")
    page.get_by_label("Token", exact=True).fill(TOKEN)
    page.get_by_role("button", name="Use token").click()
    expect(dialog).to_be_hidden()
    expect(page.locator(f'#models tr[data-model="{MODEL_ID}"]')).to_be_visible()
    expect(page.locator("#stream")).to_have_text("live")
    # Deploying, the events and the download all carry the token.
    open_model(page)
    deploy_with(page, "archive")
    row = newest_row(page)
    expect(row).to_have_attribute("data-status", "completed")
    stored = api(f"/v1/deployments/{row.get_attribute('data-deployment')}")
    with page.expect_download() as download:
        row.locator(".ref-cell a").click()
    got = Path(download.value.path()).read_bytes()
    want = (Path(stored["out_dir"]) / stored["ref"].removeprefix("/out/")).read_bytes()
    assert got == want, f"downloaded {len(got)} bytes, the out-dir file has {len(want)}"
    urls = page.evaluate("performance.getEntriesByType('resource').map(e => e.name).join(' ')")
    assert TOKEN not in urls, "the token went into a URL"


def scenario_mlflow_origin(page, shots):
    # A model as the server records one registered from MLflow (its params'
    # mlflow_* keys): the page says where it came from and links its run.
    run_url = "http://mlflow.invalid/#/experiments/0/runs/abc123"
    status = send("POST", "/v1/models", {
        "name": "fraud", "job_id": "page-mlflow-1", "check_source": False,
        "source": "http://127.0.0.1:1/{path}",
        "files": [{"path": "MLmodel", "size_bytes": 33}],
        "params": {"mlflow_name": "fraud", "mlflow_version": "7", "mlflow_alias": "champion",
                   "mlflow_run_id": "abc123", "mlflow_run_url": run_url},
    })
    assert status == 201, status
    model = next(m for m in api("/v1/models")["models"] if m["job_id"] == "page-mlflow-1")
    page.goto(f"{URL}/#/models/{model['id']}")
    origin = page.locator("dt:text-is('From MLflow') + dd")
    expect(origin).to_contain_text("fraud version 7 (alias champion)")
    expect(origin.get_by_role("link", name="run abc123")).to_have_attribute("href", run_url)
    shots("model")


SCENARIOS = [
    scenario_schema_form_and_archive,
    scenario_mlflow_origin,
    scenario_failing_deployer,
    scenario_bad_options,
    scenario_slow_then_cancel,
    scenario_register_with_three_mistakes,
    scenario_narrow_and_dark,
    scenario_corrupt_plugin,
    scenario_pushed_deployer,
    scenario_approval,
    scenario_no_deployers,
    # Last: the restarted process runs target/debug/berth as it is then.
    scenario_reconnects_after_restart,
]

# Refusals the scenarios provoke on purpose (400s, the 401 before a token
# is given) and the restart's refused
# connections: Chromium reports each as a console error.
EXPECTED_CONSOLE = ("Failed to load resource: the server responded with a status of 400",
                    "Failed to load resource: the server responded with a status of 401",
                    "Failed to load resource: net::ERR_CONNECTION_REFUSED")


def main():
    SHOTS.mkdir(parents=True, exist_ok=True)
    failures = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for scenario in [scenario_token] if TOKEN else SCENARIOS:
            name = scenario.__name__.removeprefix("scenario_")
            context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            errors = []
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("console", lambda m: m.type == "error" and not m.text.startswith(EXPECTED_CONSOLE)
                    and errors.append(f"console error: {m.text}"))
            taken = []

            def shots(view, page=page, name=name, taken=taken):
                path = SHOTS / f"{name}-{view}.png"
                page.screenshot(path=str(path), full_page=True)
                taken.append(path)

            try:
                scenario(page, shots)
                assert not errors, "; ".join(errors)
                print(f"ok: {name}", file=sys.stderr, flush=True)
                if not os.environ.get("BERTH_KEEP_SCREENSHOTS"):
                    for path in taken:
                        path.unlink()
            except Exception:
                failures.append(name)
                shots("at-failure")
                print(f"FAILED: {name}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            context.close()
        browser.close()
    if failures:
        print(f"failed scenarios: {', '.join(failures)}; screenshots in {SHOTS}", file=sys.stderr)
        sys.exit(1)


main()
