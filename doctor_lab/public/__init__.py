"""The public classes of issue 61's table, examined bare from the command line as a user would
point the doctor at them (`python -m attention_doctor FACTORY.py:FN` with their checkout on
PYTHONPATH), each judged against the right outcome of the row it stands for:

    python -m doctor_lab.public --source torchtitan=PATH --source OLMo=PATH ... [--out results/doctor/public]

records.py: one record per target (the codebase, the commit measured, the file, the factory that
builds it small with random weights, the modules it stubs, the right outcome per check and why);
factories/: those factories, each importing the class from the user's checkout (third-party code
is pointed at, never copied here); caller.py: the caller's model before and after examine();
__main__.py: runs each target in a subprocess of its own, prints and writes the verdicts."""
