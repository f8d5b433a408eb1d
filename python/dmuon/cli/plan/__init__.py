"""`python -m dmuon plan`: the owner plans of a model's Muon matrices (command.py), read from
a manifest or a Hugging Face config.json (manifest.py; the shipped ones in manifests/); the
planner offline (planner.py) and measured cost tables (profile.py) over dmuon.analysis.plan."""
