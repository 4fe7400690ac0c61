#!/usr/bin/env python3
"""Render docs/E2E.md from a make e2e run: bin/e2e/junit_01.xml (e2e.test's
JUnit), bin/e2e/meta.txt (commit, kernel, times; written by hack/e2e/e2e.sh)
and hack/e2e/notes.md (the analysis of failures, kept by hand).

    python3 hack/e2e/report.py bin/e2e [more run dirs...] docs/E2E.md
"""
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET


def section(art, junit_out, level):
    files = sorted(glob.glob(os.path.join(art, "junit*.xml")))
    if not files:
        raise SystemExit("report: no JUnit file in %s" % art)
    meta = {}
    mp = os.path.join(art, "meta.txt")
    if os.path.exists(mp):
        for line in open(mp):
            k, _, v = line.rstrip("\n").partition("=")
            meta[k] = v
    # Only the specs the focus selected (JUnit lists every spec of the suite).
    focus = re.compile(meta["focus"]) if meta.get("focus") else None
    skip = re.compile(meta["skip"]) if meta.get("skip") else None
    rows = []
    for f in files:
        for tc in ET.parse(f).getroot().iter("testcase"):
            name = tc.get("name", "")
            name = re.sub(r"^\[It\]\s*", "", name)
            if not name.startswith("[sig-"):
                continue  # suite setup and teardown nodes
            status = tc.get("status") or ""
            msg = ""
            sk = tc.find("skipped")
            fl = tc.find("failure")
            er = tc.find("error")
            if fl is not None or er is not None:
                status = "failed"
                node = fl if fl is not None else er
                msg = node.get("message") or (node.text or "")
            elif sk is not None:
                status = "skipped"
                msg = sk.get("message") or (sk.text or "")
            elif not status:
                status = "passed"
            if focus is not None and not focus.search(name):
                continue  # outside the focus: not part of this run
            if status == "skipped" and skip is not None and skip.search(name):
                msg = "skipped by name (--ginkgo.skip): " + skip.search(name).group(0)
            msg = re.sub(r"\s+", " ", msg).strip()
            msg = re.sub(r"^skipped\s*-?\s*", "", msg)
            rows.append((name, status, float(tc.get("time", "0") or 0), msg))
    # The JUnit file kept beside the report: the focused specs only (the
    # suite's file lists all ~3200 specs, 1 MB).
    keep = {r[0] for r in rows}
    for f in files[:1]:
        tree = ET.parse(f)
        for suite in tree.getroot().iter("testsuite"):
            for tc in list(suite.findall("testcase")):
                if re.sub(r"^\[It\]\s*", "", tc.get("name", "")) not in keep:
                    suite.remove(tc)
            suite.set("tests", str(len(suite.findall("testcase"))))
            suite.set("skipped", str(sum(1 for r in rows if r[1] == "skipped")))
            suite.set("failures", str(sum(1 for r in rows if r[1] == "failed")))
        tree.write(junit_out, encoding="unicode", xml_declaration=True)
    rows.sort(key=lambda r: ({"failed": 0, "passed": 1, "skipped": 2}.get(r[1], 3), r[0]))
    count = {s: sum(1 for r in rows if r[1] == s) for s in ("passed", "failed", "skipped")}
    w = []
    w.append("JUnit: `%s` (the focused specs of the run's `bin/e2e/junit_01.xml`).\n" % os.path.basename(junit_out))
    w.append("| | |\n|---|---|")
    for k, label in (("commit", "repository HEAD at the run"), ("version", "xvs tested (xvs --version)"), ("kernel", "kernel"),
                     ("k8s", "Kubernetes (all components, e2e.test)"), ("date", "date"), ("nodes", "nodes"),
                     ("build", "component build"), ("bringup", "cluster bring-up"),
                     ("e2e", "e2e.test run"), ("total", "make e2e total")):
        if k in meta:
            w.append("| %s | %s |" % (label, meta[k]))
    if "focus" in meta:
        w.append("| focus | `%s` |" % meta["focus"].replace("|", "\\|"))
    if "skip" in meta:
        w.append("| skip | `%s` |" % meta["skip"].replace("|", "\\|"))
    w.append("| result | **%d passed, %d failed, %d skipped** (%d specs) |\n" %
             (count["passed"], count["failed"], count["skipped"], len(rows)))
    if level == 0:
        notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes.md")
        if os.path.exists(notes):
            w.append(open(notes).read().rstrip() + "\n")
    w.append("### Spec by spec\n" if level else "## Spec by spec\n")
    w.append("| spec | result | time | reason / symptom |\n|---|---|---:|---|")
    for name, status, t, msg in rows:
        if len(msg) > 400:
            msg = msg[:400] + "..."
        w.append("| %s | %s | %.0fs | %s |" % (name.replace("|", "\\|"), status, t,
                                               msg.replace("|", "\\|")))
    w.append("")
    print("report: %s: %d passed, %d failed, %d skipped" % (art, count["passed"], count["failed"], count["skipped"]))
    return w



def main(out, arts):
    """The first run is the main one (notes.md follows its summary); each
    further run gets a section titled by its meta.txt's title= line."""
    w = ["# xvs against upstream Kubernetes e2e\n",
         "Rendered by `make e2e` (hack/e2e/report.py). The rig: "
         "[hack/e2e/README.md](../hack/e2e/README.md).\n"]
    base = os.path.splitext(out)[0]
    for i, art in enumerate(arts):
        if i:
            title = "Run %d" % (i + 1)
            mp = os.path.join(art, "meta.txt")
            for line in open(mp) if os.path.exists(mp) else []:
                if line.startswith("title="):
                    title = line[len("title="):].strip()
            w.append("## %s\n" % title)
        w += section(art, base + ("-junit.xml" if i == 0 else "-junit-%d.xml" % (i + 1)), i)
    with open(out, "w") as f:
        f.write("\n".join(w))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1], sys.argv[1:-1]))
