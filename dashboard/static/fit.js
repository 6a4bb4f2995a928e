// A fit job's page: poll its progress every second until it is done, failed or cancelled.
(function () {
  "use strict";
  var box = document.getElementById("job");
  var id = box.dataset.job;
  function show(job) {
    document.getElementById("job-status").textContent = job.status;
    document.getElementById("job-stale").hidden = !job.stale;
    document.getElementById("job-stage").textContent = job.stage || "-";
    document.getElementById("job-progress").value = job.progress;
    document.getElementById("job-percent").textContent = Math.round(100 * job.progress) + "%";
    var result = document.getElementById("job-result");
    if (job.adapter_id) {
      result.innerHTML = "";
      var a = document.createElement("a");
      a.href = "/dashboard/adapters";
      a.textContent = "version id " + job.adapter_id;
      result.append(a);
    } else if (job.error) {
      result.textContent = job.error;
    }
    var ended = job.status === "done" || job.status === "failed" || job.status === "cancelled";
    var cancel = document.getElementById("job-cancel");
    if (ended && cancel) { cancel.remove(); }
    return ended;
  }
  function poll() {
    fetch("/dashboard/fits/" + encodeURIComponent(id) + "/progress", { cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (job) { if (!show(job)) { setTimeout(poll, 1000); } })
      .catch(function () { setTimeout(poll, 3000); });
  }
  poll();
})();
