"""``fedsweep tune``: sweep files and their trials (``spec``), the Ray Tune driver (``tune``), one
trial (``trainable``), packed trials (``pack``), the driver's MLflow writes and progress lines
(``callbacks``), Ray clusters and authentication (``cluster``) and the sweep's storage (``storage``).
Imports :mod:`fedsweep.runs` and the layers below it."""
