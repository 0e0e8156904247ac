/* random.h: the counter-based hash behind dropout's masks (lowbias32 by C. Wellons): the
   same bits on every device and in the NumPy reference (portanet/rng.py) for the same key
   and element. */

DEVICE unsigned int mix32(unsigned int h) {
    h ^= h >> 16; h *= 0x7feb352du;
    h ^= h >> 15; h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

/* scale where element i of the mask of `key` keeps its value (uniform(key, i) >= rate),
   else 0 */
DEVICE real kept(const unsigned int key, const unsigned int i, const real rate,
                 const real scale) {
    const unsigned int h = mix32(i * 0x9e3779b1u + key);
    return (real)(h >> 8) * (real)(1.0f / 16777216.0f) >= rate ? scale : (real)0;
}
