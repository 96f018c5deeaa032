"""One run: the LightningModule that trains a whole federated round per ``training_step``
(``module``), ``fedsweep run`` around it (``run``), its MLflow tracking (``tracking``), its plots
(``plots``), output checks (``paths``) and ``fedsweep bench`` (``bench``).
Imports the simulation layers (config, sim, data, algorithms, engine) and util; never the sweep."""
