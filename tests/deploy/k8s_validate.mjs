// Validates the rendered deploy/k8s base offline:
//   node k8s_validate.mjs RENDERED.yaml NODE_MODULES_DIR GRAFANA_DASHBOARD.json
// - every built-in object against the Kubernetes OpenAPI schemas (npm kubernetes-models@5:
//   types, required fields, formats; unknown fields are not caught);
// - the prometheus-operator objects (not in kubernetes-models) by hand: fields and types, and
//   that their selectors and port names find the coordinator Service / worker pods;
// - references between objects: volumes' PVC/Secret/ConfigMap, secretKeyRef keys, Service
//   selectors and ports, workload selectors vs template labels, one GPU per worker;
// - the Grafana dashboard ConfigMap holds a dashboard (JSON with panels); a copy that differs
//   from deploy/grafana's is reported as a warning.
// Prints one line per check that failed and a summary line; exit 1 on any failure.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [rendered, modulesArg, dashboardFile] = process.argv.slice(2);
if (!rendered || !modulesArg || !dashboardFile) {
  console.error("usage: node k8s_validate.mjs RENDERED.yaml NODE_MODULES_DIR DASHBOARD.json");
  process.exit(2);
}
const modulesDir = path.resolve(modulesArg);
const yaml = createRequire(path.join(modulesDir, "noop.js"))("js-yaml");

let passed = 0;
let failed = 0;
function check(ok, what) {
  if (ok) {
    passed++;
  } else {
    failed++;
    console.log(`FAIL ${what}`);
  }
}
const id = (o) => `${o.kind}/${o.metadata?.name}`;

const docs = yaml.loadAll(fs.readFileSync(rendered, "utf8")).filter((d) => d);
check(docs.length > 0, "kustomize rendered no objects");

// --- schemas -------------------------------------------------------------------------------
const crdKinds = new Set(["monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor"]);
for (const doc of docs) {
  const key = `${doc.apiVersion}/${doc.kind}`;
  if (crdKinds.has(key)) continue;
  // "v1" is the core group (kubernetes-models/v1), "apps/v1" -> kubernetes-models/apps/v1.
  const file = path.join(modulesDir, "kubernetes-models", doc.apiVersion, `${doc.kind}.js`);
  if (!fs.existsSync(file)) {
    check(false, `${id(doc)}: no Kubernetes schema for ${key}`);
    continue;
  }
  const mod = await import(pathToFileURL(file).href);
  try {
    new mod[doc.kind](doc).validate();
    check(true, id(doc));
    console.log(`schema ok  ${key} ${doc.metadata.name}`);
  } catch (e) {
    check(false, `${id(doc)}: ${e.message}`);
  }
}

// --- helpers -------------------------------------------------------------------------------
const byKind = (kind) => docs.filter((d) => d.kind === kind);
const find = (kind, name) => docs.find((d) => d.kind === kind && d.metadata?.name === name);
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const isObject = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const workloads = [...byKind("Deployment"), ...byKind("StatefulSet"), ...byKind("Job")];
const podTemplates = workloads.map((w) => ({ owner: id(w), tmpl: w.spec.template }));
const containerPorts = (tmpl) =>
  tmpl.spec.containers.flatMap((c) => c.ports ?? []).map((p) => p.name);

// --- references between objects ------------------------------------------------------------
for (const w of workloads) {
  const labels = w.spec.template.metadata?.labels;
  if (w.kind !== "Job")
    check(
      Object.keys(w.spec.selector?.matchLabels ?? {}).length > 0 &&
        matches(w.spec.selector.matchLabels, labels),
      `${id(w)}: selector does not match its pod template's labels`,
    );
  const spec = w.spec.template.spec;
  for (const v of spec.volumes ?? []) {
    if (v.persistentVolumeClaim)
      check(find("PersistentVolumeClaim", v.persistentVolumeClaim.claimName), `${id(w)}: volume ${v.name}: no PVC ${v.persistentVolumeClaim.claimName}`);
    if (v.secret) check(find("Secret", v.secret.secretName), `${id(w)}: volume ${v.name}: no Secret ${v.secret.secretName}`);
    if (v.configMap) check(find("ConfigMap", v.configMap.name), `${id(w)}: volume ${v.name}: no ConfigMap ${v.configMap.name}`);
  }
  for (const c of spec.containers) {
    const volumeNames = new Set((spec.volumes ?? []).map((v) => v.name));
    for (const m of c.volumeMounts ?? [])
      check(volumeNames.has(m.name), `${id(w)}: container ${c.name} mounts unknown volume ${m.name}`);
    for (const e of c.env ?? []) {
      const ref = e.valueFrom?.secretKeyRef;
      if (!ref) continue;
      const s = find("Secret", ref.name);
      const keys = Object.keys({ ...(s?.data ?? {}), ...(s?.stringData ?? {}) });
      check(s && keys.includes(ref.key), `${id(w)}: env ${e.name}: no key ${ref.key} in Secret ${ref.name}`);
    }
    // Files the container is told to read must come from a mounted Secret/ConfigMap key.
    for (const a of [...(c.command ?? []), ...(c.args ?? [])]) {
      const m = /^--[a-z-]*file=(.+)$/.exec(a);
      if (!m) continue;
      const mount = (c.volumeMounts ?? []).find((vm) => m[1].startsWith(vm.mountPath + "/"));
      const vol = (spec.volumes ?? []).find((v) => v.name === mount?.name);
      const key = mount ? m[1].slice(mount.mountPath.length + 1) : "";
      const src = vol?.secret ? find("Secret", vol.secret.secretName) : vol?.configMap ? find("ConfigMap", vol.configMap.name) : null;
      const keys = Object.keys({ ...(src?.data ?? {}), ...(src?.stringData ?? {}) });
      check(keys.includes(key), `${id(w)}: ${a}: not a key of a mounted Secret or ConfigMap`);
    }
  }
}
for (const svc of byKind("Service")) {
  const pods = podTemplates.filter((p) => matches(svc.spec.selector, p.tmpl.metadata?.labels));
  check(pods.length > 0, `${id(svc)}: selector matches no pod template`);
  for (const port of svc.spec.ports ?? [])
    if (typeof port.targetPort === "string")
      check(pods.some((p) => containerPorts(p.tmpl).includes(port.targetPort)), `${id(svc)}: targetPort ${port.targetPort} is no named container port`);
}
const coordinator = find("Deployment", "forge-coordinator");
check(coordinator?.spec.replicas === 1, "Deployment/forge-coordinator: exactly one replica (one SQLite store)");
check(coordinator?.spec.strategy?.type === "Recreate", "Deployment/forge-coordinator: strategy Recreate (never two on the store)");
const workers = find("StatefulSet", "forge-worker");
check(workers, "StatefulSet/forge-worker missing");
if (workers) {
  const limits = workers.spec.template.spec.containers[0].resources?.limits ?? {};
  check(String(limits["nvidia.com/gpu"]) === "1", "StatefulSet/forge-worker: one nvidia.com/gpu per worker");
  const headless = find("Service", workers.spec.serviceName);
  check(headless?.spec.clusterIP === "None", `StatefulSet/forge-worker: serviceName ${workers.spec.serviceName} is no headless Service`);
  const args = workers.spec.template.spec.containers[0].args ?? [];
  const target = args.find((a) => a.startsWith("--coordinator="))?.split("=")[1] ?? "";
  const [host, port] = target.split(":");
  const svc = find("Service", host);
  check(svc && (svc.spec.ports ?? []).some((p) => String(p.port) === port), `StatefulSet/forge-worker: --coordinator=${target} is no Service port`);
}
const pvc = find("PersistentVolumeClaim", "forge-data");
check(pvc?.spec.accessModes?.includes("ReadWriteMany"), "PersistentVolumeClaim/forge-data: ReadWriteMany (workers on many nodes write checkpoints)");
const statePvc = find("PersistentVolumeClaim", "forge-state");
check(statePvc?.spec.accessModes?.includes("ReadWriteOnce"), "PersistentVolumeClaim/forge-state: ReadWriteOnce (the coordinator's SQLite store)");
const stateArg = (coordinator?.spec.template.spec.containers[0].args ?? []).find((a) => a.startsWith("--state-dir="));
const stateDir = stateArg?.slice("--state-dir=".length) ?? "";
const stateMount = (coordinator?.spec.template.spec.containers[0].volumeMounts ?? [])
  .filter((m) => stateDir === m.mountPath || stateDir.startsWith(m.mountPath + "/"))
  .sort((x, y) => y.mountPath.length - x.mountPath.length)[0];
const stateVol = coordinator?.spec.template.spec.volumes?.find((v) => v.name === stateMount?.name);
check(stateVol?.persistentVolumeClaim?.claimName === "forge-state", "Deployment/forge-coordinator: --state-dir is on the forge-state volume");

// --- prometheus-operator objects, by hand --------------------------------------------------
function checkMonitor(mon, listKey, targets, targetPorts) {
  const what = id(mon);
  check(typeof mon.metadata?.name === "string" && mon.metadata.name.length > 0, `${what}: metadata.name`);
  check(isObject(mon.spec), `${what}: spec is an object`);
  const sel = mon.spec?.selector?.matchLabels;
  check(isObject(sel) && Object.keys(sel).length > 0 && Object.values(sel).every((v) => typeof v === "string"), `${what}: spec.selector.matchLabels is a non-empty string map`);
  const allowed = new Set(["selector", listKey, "namespaceSelector", "jobLabel", "podTargetLabels", "targetLabels", "sampleLimit"]);
  for (const k of Object.keys(mon.spec ?? {})) check(allowed.has(k), `${what}: unknown spec field ${k}`);
  const eps = mon.spec?.[listKey];
  check(Array.isArray(eps) && eps.length > 0, `${what}: spec.${listKey} is a non-empty list`);
  const hits = targets.filter((t) => matches(sel, t.labels));
  check(hits.length > 0, `${what}: selector matches nothing in the base`);
  const epFields = new Set(["port", "path", "interval", "scrapeTimeout", "scheme", "relabelings", "metricRelabelings", "honorLabels"]);
  for (const ep of eps ?? []) {
    for (const k of Object.keys(ep)) check(epFields.has(k), `${what}: unknown endpoint field ${k}`);
    check(typeof ep.port === "string" && ep.port.length > 0, `${what}: endpoint port is a port name`);
    check(ep.path === undefined || (typeof ep.path === "string" && ep.path.startsWith("/")), `${what}: endpoint path`);
    check(ep.interval === undefined || /^[0-9]+(ms|s|m|h)$/.test(ep.interval), `${what}: endpoint interval ${ep.interval} is a duration`);
    check(hits.every((t) => targetPorts(t).includes(ep.port)), `${what}: port ${ep.port} not named on every selected target`);
    for (const r of ep.relabelings ?? [])
      check(Array.isArray(r.sourceLabels ?? []) && (r.targetLabel === undefined || typeof r.targetLabel === "string"), `${what}: relabeling shape`);
  }
}
for (const mon of docs.filter((d) => d.apiVersion === "monitoring.coreos.com/v1")) {
  if (mon.kind === "ServiceMonitor") {
    const services = byKind("Service").map((s) => ({ labels: s.metadata.labels, obj: s }));
    checkMonitor(mon, "endpoints", services, (t) => (t.obj.spec.ports ?? []).map((p) => p.name));
  } else if (mon.kind === "PodMonitor") {
    const pods = podTemplates.map((p) => ({ labels: p.tmpl.metadata?.labels, obj: p.tmpl }));
    checkMonitor(mon, "podMetricsEndpoints", pods, (t) => containerPorts(t.obj));
  } else {
    check(false, `${id(mon)}: unknown monitoring.coreos.com kind`);
  }
}
check(byKind("ServiceMonitor").length === 1 && byKind("PodMonitor").length === 1, "one ServiceMonitor (coordinator) and one PodMonitor (workers)");

// --- Grafana dashboard ---------------------------------------------------------------------
const dash = docs.find((d) => d.kind === "ConfigMap" && d.metadata?.labels?.grafana_dashboard === "1");
check(dash, "no ConfigMap labelled grafana_dashboard=1");
if (dash) {
  const entries = Object.entries(dash.data ?? {});
  check(entries.length === 1, `${id(dash)}: one dashboard`);
  for (const [name, text] of entries) {
    let parsed = null;
    try {
      parsed = JSON.parse(text);
    } catch (e) {
      check(false, `${id(dash)}: ${name} is not JSON: ${e.message}`);
    }
    check(parsed && Array.isArray(parsed.panels) && parsed.panels.length > 0, `${id(dash)}: ${name} has panels`);
    // A stale copy is reported, not failed: deploy/grafana changes in other commits.
    if (!fs.existsSync(dashboardFile)) console.log(`note: ${dashboardFile} not found: copy not compared`);
    else if (text !== fs.readFileSync(dashboardFile, "utf8"))
      console.log(`WARNING ${id(dash)}: ${name} differs from ${dashboardFile}: cp it into deploy/k8s/dashboards/`);
    else console.log(`dashboard ok  ${name} is ${dashboardFile}`);
  }
}

console.log(`k8s: ${docs.length} objects`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
