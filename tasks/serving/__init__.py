"""The prediction service and ``hydra-ens predict``: a verified bundle loaded to serve
(:mod:`.served`), the prod model holder that hot-swaps versions (:mod:`.prod_model`), the
micro-batcher (:mod:`.microbatch`) and the prediction rows (:mod:`.predict`)."""
