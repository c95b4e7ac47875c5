"""Per diffusers class, a declaration the face reads (family.py says what one holds), one module per class
group. The face and the loader read only ``FAMILIES``; no code outside this package names a family.
"""
from .cogvideox import AUTOENCODER_KL_COGVIDEOX
from .cosmos import AUTOENCODER_KL_COSMOS
from .family import MISSING, Family, Number
from .flux2 import AUTOENCODER_KL_FLUX2
from .hunyuan import AUTOENCODER_KL_HUNYUAN_VIDEO, AUTOENCODER_KL_HUNYUAN_VIDEO15
from .hunyuan_image import AUTOENCODER_KL_HUNYUAN_IMAGE, AUTOENCODER_KL_HUNYUAN_IMAGE_REFINER
from .image import AUTOENCODER_KL, AUTOENCODER_TINY
from .ltx import AUTOENCODER_KL_LTX2_VIDEO, AUTOENCODER_KL_LTX_VIDEO
from .magvit import AUTOENCODER_KL_MAGVIT
from .qwen_image21 import AUTOENCODER_KL_QWEN_IMAGE21
from .svd import AUTOENCODER_KL_TEMPORAL_DECODER
from .wan import AUTOENCODER_KL_QWEN_IMAGE, AUTOENCODER_KL_WAN

# In order: where several serve one file, a folder's config.json or a file-name word chooses, else the first.
FAMILIES = (AUTOENCODER_KL, AUTOENCODER_TINY, AUTOENCODER_KL_WAN, AUTOENCODER_KL_QWEN_IMAGE, AUTOENCODER_KL_LTX_VIDEO,
            AUTOENCODER_KL_HUNYUAN_VIDEO, AUTOENCODER_KL_HUNYUAN_VIDEO15,
            AUTOENCODER_KL_COGVIDEOX, AUTOENCODER_KL_LTX2_VIDEO, AUTOENCODER_KL_MAGVIT,
            AUTOENCODER_KL_FLUX2, AUTOENCODER_KL_QWEN_IMAGE21, AUTOENCODER_KL_HUNYUAN_IMAGE,
            AUTOENCODER_KL_HUNYUAN_IMAGE_REFINER, AUTOENCODER_KL_TEMPORAL_DECODER, AUTOENCODER_KL_COSMOS)

__all__ = ["FAMILIES", "Family", "MISSING", "Number"]
