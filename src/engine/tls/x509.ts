import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
  randomBytes,
  sign,
  X509Certificate,
} from "node:crypto";
import { isIP } from "node:net";
import forge from "node-forge";

// node-forge builds the certificate structures (DER, names, extensions); node:crypto makes the
// keys and the signatures. forge alone can only sign with RSA in pure JavaScript, which costs
// 40-150 ms per signature plus 25-150 ms per RSA-2048 key; an ECDSA P-256 key and signature from
// node:crypto cost well under a millisecond each. P-256 is what Caddy's internal CA uses for its
// root, intermediate and leaves, and every browser, curl, Python and Node accept it.

const asn1 = forge.asn1;
// certificateExtensionsToAsn1 is public in node-forge but missing from its type definitions.
interface ForgeExtensions {
  certificateExtensionsToAsn1(extensions: unknown[]): forge.asn1.Asn1;
}
const OID_EC_SIGNATURE_SHA256 = "1.2.840.10045.4.3.2";
const OID_SUBJECT_KEY_IDENTIFIER = "2.5.29.14";
const OID_AUTHORITY_KEY_IDENTIFIER = "2.5.29.35";

/** KeyPair is a private key and its public half, both node:crypto key objects. */
export interface KeyPair {
  privateKey: KeyObject;
  publicKey: KeyObject;
}

/** generateKeyPair makes a fresh ECDSA P-256 key pair. */
export function generateKeyPair(): KeyPair {
  return generateKeyPairSync("ec", { namedCurve: "prime256v1" });
}

/** privateKeyPem writes a private key as unencrypted PKCS#8 PEM, the form Bun.serve, nginx and curl read. */
export function privateKeyPem(key: KeyObject): string {
  return key.export({ type: "pkcs8", format: "pem" }).toString();
}

/** loadPrivateKey reads a PEM private key; it returns undefined when the text is not one. */
export function loadPrivateKey(pem: string): KeyObject | undefined {
  try {
    return createPrivateKey(pem);
  } catch {
    return undefined;
  }
}

/** keyMatches tells whether a private key is the one for a certificate's public key. */
export function keyMatches(certificate: X509Certificate, privateKey: KeyObject): boolean {
  const fromCertificate = certificate.publicKey.export({ type: "spki", format: "der" });
  const fromKey = createPublicKey(privateKey).export({ type: "spki", format: "der" });
  return fromCertificate.equals(fromKey);
}

/**
 * keyIdentifier computes a subject key identifier as RFC 5280 §4.2.1.2 method (1) describes:
 * the SHA-1 of the subjectPublicKey bits, here the uncompressed EC point 04 || x || y.
 */
export function keyIdentifier(publicKey: KeyObject): Buffer {
  const jwk = publicKey.export({ format: "jwk" });
  if (jwk.kty !== "EC" || !jwk.x || !jwk.y) throw new Error("keyIdentifier: only EC public keys are supported");
  const point = Buffer.concat([Buffer.from([4]), Buffer.from(jwk.x, "base64url"), Buffer.from(jwk.y, "base64url")]);
  return createHash("sha1").update(point).digest();
}

/**
 * randomSerial returns a random positive 127-bit serial number as hex. The first byte is kept
 * between 0x01 and 0x7f so the DER INTEGER is positive and minimally encoded as it stands.
 */
export function randomSerial(): string {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0] ?? 0) & 0x7f || 1;
  return bytes.toString("hex");
}

/** SignedCertificate is a certificate as PEM and parsed. */
export interface SignedCertificate {
  pem: string;
  parsed: X509Certificate;
}

/** DistinguishedName is the part of an X.509 name the engine writes: an organization and a common name. */
export interface DistinguishedName {
  organization?: string;
  commonName?: string;
}

/** CertificateTemplate is what a new certificate says and who signs it. */
export interface CertificateTemplate {
  subject: DistinguishedName;
  serialHex: string;
  notBefore: Date;
  notAfter: Date;
  publicKey: KeyObject;
  /** ca makes a CA certificate; pathLength limits how many CAs may follow it in a chain. */
  ca?: { pathLength: number };
  /** dnsNames and ipAddresses become the subjectAltName of a leaf. */
  dnsNames?: string[];
  ipAddresses?: string[];
  /**
   * signer signs the certificate. Its certificate gives the issuer name (copied byte for byte, so
   * chain building matches it) and the authority key identifier; without one the certificate is
   * self-signed.
   */
  signer: { privateKey: KeyObject; certificate?: X509Certificate };
}

/** signCertificate builds an X.509 v3 certificate from a template and signs it with ECDSA-SHA256. */
export function signCertificate(template: CertificateTemplate): SignedCertificate {
  const holder = forge.pki.createCertificate();
  const extensions: Record<string, unknown>[] = [];
  if (template.ca) {
    extensions.push({ name: "basicConstraints", critical: true, cA: true, pathLenConstraint: template.ca.pathLength });
    extensions.push({ name: "keyUsage", critical: true, digitalSignature: true, keyCertSign: true, cRLSign: true });
  } else {
    extensions.push({ name: "basicConstraints", critical: true, cA: false });
    // RFC 5480 §3: an EC key's certificate must not assert keyEncipherment; ECDHE key exchange
    // needs only digitalSignature.
    extensions.push({ name: "keyUsage", critical: true, digitalSignature: true });
    extensions.push({ name: "extKeyUsage", serverAuth: true });
    const altNames = [
      ...(template.dnsNames ?? []).map((value) => ({ type: 2, value })),
      ...(template.ipAddresses ?? []).map((ip) => ({ type: 7, ip })),
    ];
    // RFC 5280 §4.2.1.6: with an empty subject the subjectAltName must be critical.
    const emptySubject = !template.subject.commonName && !template.subject.organization;
    extensions.push({ name: "subjectAltName", critical: emptySubject, altNames });
  }
  extensions.push({ id: OID_SUBJECT_KEY_IDENTIFIER, value: octetString(keyIdentifier(template.publicKey)) });
  if (template.signer.certificate) {
    extensions.push({
      id: OID_AUTHORITY_KEY_IDENTIFIER,
      value: asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
        asn1.create(asn1.Class.CONTEXT_SPECIFIC, 0, false, keyIdentifier(template.signer.certificate.publicKey).toString("binary")),
      ]),
    });
  }
  // setExtensions fills in each extension's DER value; the key identifiers above carry theirs.
  holder.setExtensions(extensions);

  const signatureAlgorithm = asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
    // RFC 5758 §3.2: ecdsa-with-SHA256 has no parameters, not even NULL.
    asn1.create(asn1.Class.UNIVERSAL, asn1.Type.OID, false, asn1.oidToDer(OID_EC_SIGNATURE_SHA256).getBytes()),
  ]);
  const spki = asn1.fromDer(template.publicKey.export({ type: "spki", format: "der" }).toString("binary"));
  const tbs = asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
    asn1.create(asn1.Class.CONTEXT_SPECIFIC, 0, true, [
      asn1.create(asn1.Class.UNIVERSAL, asn1.Type.INTEGER, false, asn1.integerToDer(2).getBytes()),
    ]),
    asn1.create(asn1.Class.UNIVERSAL, asn1.Type.INTEGER, false, forge.util.hexToBytes(template.serialHex)),
    signatureAlgorithm,
    template.signer.certificate ? subjectOf(template.signer.certificate) : distinguishedName(template.subject),
    asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [time(template.notBefore), time(template.notAfter)]),
    distinguishedName(template.subject),
    spki,
    (forge.pki as unknown as ForgeExtensions).certificateExtensionsToAsn1(holder.extensions),
  ]);
  const tbsDer = Buffer.from(asn1.toDer(tbs).getBytes(), "binary");
  const signature = sign("sha256", tbsDer, template.signer.privateKey);
  const certificate = asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
    tbs,
    signatureAlgorithm,
    asn1.create(asn1.Class.UNIVERSAL, asn1.Type.BITSTRING, false, `\u0000${signature.toString("binary")}`),
  ]);
  const der = Buffer.from(asn1.toDer(certificate).getBytes(), "binary");
  const pem = `-----BEGIN CERTIFICATE-----\n${der.toString("base64").replace(/.{64}/g, "$&\n").replace(/\n?$/, "\n")}-----END CERTIFICATE-----\n`;
  return { pem, parsed: new X509Certificate(pem) };
}

/** parseCertificate reads the first certificate of a PEM text; it returns undefined when there is none. */
export function parseCertificate(pem: string): X509Certificate | undefined {
  try {
    return new X509Certificate(pem);
  } catch {
    return undefined;
  }
}

/** splitPemCertificates returns each CERTIFICATE block of a PEM text, in order. */
export function splitPemCertificates(text: string): string[] {
  return text.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----\n?/g) ?? [];
}

/** commonNameOf returns the common name in a certificate's subject, or "" when it has none. */
export function commonNameOf(certificate: X509Certificate): string {
  return /^CN=(.*)$/m.exec(certificate.subject)?.[1] ?? "";
}

/** isIpLiteral tells whether a name is an IPv4 or IPv6 address rather than a DNS name. */
export function isIpLiteral(name: string): boolean {
  return isIP(name) !== 0;
}

/** wholeSeconds drops the milliseconds a certificate's time fields cannot hold. */
export function wholeSeconds(date: Date): Date {
  return new Date(Math.floor(date.getTime() / 1000) * 1000);
}

function octetString(bytes: Buffer): forge.asn1.Asn1 {
  return asn1.create(asn1.Class.UNIVERSAL, asn1.Type.OCTETSTRING, false, bytes.toString("binary"));
}

// subjectOf returns a certificate's subject name as it is encoded there (TBSCertificate field 6).
function subjectOf(certificate: X509Certificate): forge.asn1.Asn1 {
  const parsed = asn1.fromDer(certificate.raw.toString("binary"));
  const tbs = (parsed.value as forge.asn1.Asn1[])[0];
  const subject = (tbs?.value as forge.asn1.Asn1[] | undefined)?.[5];
  if (!subject) throw new Error("subjectOf: not an X.509 v3 certificate");
  return subject;
}

function distinguishedName(name: DistinguishedName): forge.asn1.Asn1 {
  const attribute = (oid: string, value: string) =>
    asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SET, true, [
      asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
        asn1.create(asn1.Class.UNIVERSAL, asn1.Type.OID, false, asn1.oidToDer(oid).getBytes()),
        asn1.create(asn1.Class.UNIVERSAL, asn1.Type.UTF8, false, forge.util.encodeUtf8(value)),
      ]),
    ]);
  const attributes: forge.asn1.Asn1[] = [];
  if (name.organization) attributes.push(attribute("2.5.4.10", name.organization));
  if (name.commonName) attributes.push(attribute("2.5.4.3", name.commonName));
  return asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, attributes);
}

// RFC 5280 §4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050 on.
function time(date: Date): forge.asn1.Asn1 {
  if (date.getUTCFullYear() < 2050) return asn1.create(asn1.Class.UNIVERSAL, asn1.Type.UTCTIME, false, asn1.dateToUtcTime(date));
  return asn1.create(asn1.Class.UNIVERSAL, asn1.Type.GENERALIZEDTIME, false, asn1.dateToGeneralizedTime(date));
}
