"""A pool's pipeline: loading and warming it (`loading`), one denoising run (`inference`), live previews (`preview`)."""
