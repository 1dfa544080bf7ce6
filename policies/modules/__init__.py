"""Network building blocks shared by policies and the learners' critics."""
