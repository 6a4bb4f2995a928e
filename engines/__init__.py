"""Model runtimes behind one interface: the embedded torch engine, SGLang servers, the model zoo."""
