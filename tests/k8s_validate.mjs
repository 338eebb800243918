// Validates rendered Kubernetes objects offline: core kinds with kubernetes-models' schemas, the
// JobSet with the openAPIV3Schema of the upstream JobSet CRD (and each of its Job templates as a
// batch/v1 Job). Usage:
//   node tests/k8s_validate.mjs --crd=PATH_OR_EMPTY FILE.yaml...
// Prints one line per object and "N passed, M failed"; exits 1 when any object is invalid or of
// a kind it cannot check. Without the CRD (an empty or missing path) the JobSet's own fields are
// not checked, which it says; its Job templates still are.
import fs from "node:fs";
import yaml from "js-yaml";
import Ajv from "ajv";
import { ConfigMap, PersistentVolumeClaim, Secret, Service } from "kubernetes-models/v1";
import { StatefulSet } from "kubernetes-models/apps/v1";
import { Job } from "kubernetes-models/batch/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";

const core = {
  "v1/ConfigMap": ConfigMap,
  "v1/PersistentVolumeClaim": PersistentVolumeClaim,
  "v1/Secret": Secret,
  "v1/Service": Service,
  "apps/v1/StatefulSet": StatefulSet,
  "batch/v1/Job": Job,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
};

let crdPath = "";
const files = [];
for (const arg of process.argv.slice(2)) {
  if (arg.startsWith("--crd=")) crdPath = arg.slice("--crd=".length);
  else files.push(arg);
}

let validateJobSet = null;
if (crdPath && fs.existsSync(crdPath)) {
  const crd = yaml.load(fs.readFileSync(crdPath, "utf8"));
  const version = crd.spec.versions.find((v) => v.name === "v1alpha2");
  const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false, logger: false });
  validateJobSet = ajv.compile(version.schema.openAPIV3Schema);
} else {
  console.log(`note: the JobSet CRD is not at '${crdPath}': JobSet fields are not checked against it`);
}

let passed = 0;
let failed = 0;
function check(what, fn) {
  try {
    fn();
    passed++;
    console.log(`ok    ${what}`);
  } catch (e) {
    failed++;
    console.log(`FAIL  ${what}: ${e.message}`);
  }
}

function checkJobSet(doc, what) {
  if (validateJobSet !== null) {
    check(`${what} (JobSet CRD schema)`, () => {
      if (!validateJobSet(doc)) throw new Error(JSON.stringify(validateJobSet.errors.slice(0, 5)));
    });
  }
  for (const rj of doc.spec?.replicatedJobs ?? []) {
    check(`${what} replicatedJobs[${rj.name}] as a batch/v1 Job`, () => {
      new Job({ metadata: { name: `${doc.metadata.name}-${rj.name}` }, spec: rj.template.spec }).validate();
    });
  }
}

for (const file of files) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d !== null && d !== undefined);
  if (docs.length === 0) {
    failed++;
    console.log(`FAIL  ${file}: no objects`);
  }
  for (const doc of docs) {
    const key = `${doc.apiVersion}/${doc.kind}`;
    const what = `${file}: ${doc.kind} ${doc.metadata?.name}`;
    if (key === "jobset.x-k8s.io/v1alpha2/JobSet") {
      checkJobSet(doc, what);
    } else if (core[key] !== undefined) {
      check(what, () => new core[key](doc).validate());
    } else {
      failed++;
      console.log(`FAIL  ${what}: ${key} is not a kind this check knows`);
    }
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
