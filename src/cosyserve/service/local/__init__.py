"""Local synthesis: the model loaded in this process and the work that runs on it.

`synthesizer` joins the text frontend, prompt analysis and the engine (text + voice → audio).
"""
