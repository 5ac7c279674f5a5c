"""scripts/check_doc_paths.py: README.md and docs/ name only files that exist."""

import os
import subprocess
import sys
import tempfile
import unittest

import fixtures as fx

SCRIPT = os.path.join(fx.SCRIPTS, "check_doc_paths.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)


class CheckDocPathsTest(unittest.TestCase):
    def test_the_repository_names_only_what_exists(self):
        result = run(os.path.join(fx.SCRIPTS, ".."))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_a_dangling_name_fails_and_a_pattern_does_not(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "kernels", "op", "cpu"))
            os.makedirs(os.path.join(tmp, "docs"))
            open(os.path.join(tmp, "kernels", "op", "cpu", "scan.cpp"), "w").close()
            lines = [f"`kernels/op/cpu/scan.cpp` and `scan.cpp`, `kernels/op/cpu/<your_kernel>.cpp`" for _ in range(60)]
            with open(os.path.join(tmp, "README.md"), "w") as f:
                f.write("\n".join(lines) + "\n")
            with open(os.path.join(tmp, "docs", "kernels.md"), "w") as f:
                f.write("the kernel is `kernels/op/cpu_scan.cpp` (`../kernels/op/cpu/`), its header `scan.hpp`\n")
            subprocess.run(["git", "init", "-q", tmp], check=True)
            subprocess.run(["git", "-C", tmp, "add", "."], check=True)
            result = run(tmp)
            self.assertEqual(result.returncode, 1, result.stdout)
            self.assertIn("docs/kernels.md:1: names 'kernels/op/cpu_scan.cpp'", result.stdout)
            self.assertIn("names 'scan.hpp'", result.stdout)
            self.assertNotIn("your_kernel", result.stdout)
            self.assertIn("2 dangling", result.stdout)


if __name__ == "__main__":
    unittest.main()
