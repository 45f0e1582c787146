"""The tally every interop script keeps: calling it with a check's name and outcome prints one
`ok` or `FAIL` line; `summary` prints the counts and gives the script's exit status."""


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name} {detail}")

    def summary(self, title):
        print(f"{title}: {self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
