"""The team's latent-IDM package: their dataset classes, model and HF-style trainer (an example repo)."""
