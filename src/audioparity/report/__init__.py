"""summary.csv from the cells' results (:mod:`.summary`), and the self-contained index.html
built from it (:mod:`.html`). The two are imported separately, so each rule runs only its own."""
