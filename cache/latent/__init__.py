"""Card B's three-way video-latent cache: RGB rows, point-map (PT) rows and first frames (FF).

``layout`` and ``pt_hash`` are pure Python (the control plane's ``idmctl cache status`` uses them);
``encoder``, ``files`` and ``dataset`` import torch and belong to the data plane.
"""
