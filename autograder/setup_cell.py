# Setup: run this cell first. Where the lab is installed (JupyterLab) it imports labsupport; in
# Colab it first installs the lab's helper package from LAB_URL (torch is already there).
LAB_URL = ""  # where labsupport installs from; written by the instructor's `release --student-url`
import importlib, importlib.util, subprocess, sys
if importlib.util.find_spec("labsupport") is None:  # Colab, or a kernel without the lab installed
    if not LAB_URL:
        raise RuntimeError("labsupport is not installed and this notebook has no LAB_URL to install it "
                           "from. Students: start JupyterLab from the lab's .venv (see README.md), or ask "
                           "your instructor for the lab's install link. Instructors: python -m autograder "
                           "release --student-url URL (a git+https:// repository, zip or wheel of build/student).")
    import importlib.metadata as md  # Colab's own torch is kept wherever it is new enough: never replaced
    have = md.version("torch") if importlib.util.find_spec("torch") else None
    have_mm = tuple(int(p) for p in have.split("+")[0].split(".")[:2]) if have else None
    if have_mm and have_mm < (2, 9):  # hardware.TORCH_FLOORS: the fp32_precision settings (torch 2.9)
        raise RuntimeError(f"This runtime's torch is {have}; the lab needs 2.9 or newer. Upgrading downloads "
                           "several GB (torch with its CUDA libraries, about 5 GB) and takes minutes: if you "
                           "accept that, run `!pip install -U torch torchvision` in a cell, then Runtime > "
                           "Restart session, and run this cell again. Or pick a newer runtime version first "
                           "(Runtime > Change runtime type), which costs nothing.")
    if have_mm and have_mm < (2, 11):
        print(f"torch {have} here: the lab runs with it, except 07's int8 quantisation, which needs torch "
              "2.11 and says so in its cell (an upgrade of several GB you can leave until then).")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", LAB_URL], check=True)
    importlib.invalidate_caches()  # so this kernel sees the package pip just installed
import labsupport as ls
lab = ls.setup()
