"""The usage ledger read back: who used what (`kit usage`), and whether the record of it is whole
(`kit audit`)."""
