"""Local synthesis: the model loaded in this process and the work that runs on it (a single server, or a
`cosyserve worker`).

`synthesizer` joins the text frontend, prompt analysis and the engine (text + voice → audio); `loading`
turns the settings into a loaded synthesizer; `model_host` owns it (background load, reload, readiness,
lending it to running work); `backend` is the `LocalBackend` that submits syntheses, streams, jobs and
enrolments to the scheduler; `jobs` runs a long text piece by piece and keeps its record current.
"""
